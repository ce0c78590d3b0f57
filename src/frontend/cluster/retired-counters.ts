import { AggregatorRegistry } from 'prom-client';
import type { MetricsJson } from './messages.js';

/** Monotonic metrics: what a dead child counted stays counted. Gauges die with their process. */
const MONOTONIC = new Set(['counter', 'histogram']);

/**
 * The counters (and histograms) of the frontend processes that died, merged into one set, so the
 * frontend's totals never go backwards when a process is replaced: a scrape adds them to the live
 * processes' figures, as if the dead one were still counting. Bounded however many die: each is
 * merged in, not kept.
 */
export class RetiredCounters {
  private kept: Promise<MetricsJson> = Promise.resolve([]);

  /** A process died; `last` is the latest figures it answered. */
  retire(last: MetricsJson): void {
    const monotonic = last.filter((m) => MONOTONIC.has(String(m.type)));
    this.kept = this.kept.then((kept) => AggregatorRegistry.aggregate([kept, monotonic]).getMetricsAsJSON());
  }

  metrics(): Promise<MetricsJson> {
    return this.kept;
  }
}
