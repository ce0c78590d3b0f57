/**
 * Held series (src/common/held-series.ts): the frontend's per-request counters and histograms
 * without prom-client's label hash on every call. What they expose must be what prom-client's own
 * Counter and Histogram expose for the same observations: the text page (what Prometheus and
 * promtool read) and the JSON of getMetricsAsJSON (what --processes' aggregation merges).
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { AggregatorRegistry, Counter, Histogram, Registry } from 'prom-client';
import { HeldCounter, HeldHistogram } from '../src/common/held-series.js';

const BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1];
const OBSERVED: Array<[string, string, number]> = [
  ['m1', 'default', 0.004],
  ['m1', 'default', 0.005], // on a bound: counted in it (le is "less or equal")
  ['m1', 'default', 0.3],
  ['m1', 'flex', 7], // above every bound: +Inf only
  ['lora-a', 'default', 0.01],
  ['m1', 'default', 0],
];

function fill(registry: Registry, held: boolean): void {
  const config = { name: 'h_seconds', help: 'a histogram', labelNames: ['model', 'tier'] as const, buckets: BUCKETS, registers: [registry] };
  const counted = { name: 'c_total', help: 'a counter', labelNames: ['model', 'tier', 'type'] as const, registers: [registry] };
  if (held) {
    const h = new HeldHistogram(config);
    const c = new HeldCounter(counted);
    for (const [model, tier, v] of OBSERVED) {
      h.series(model, tier).observe(v);
      c.series(model, tier, 'output').inc(64);
      c.series(model, tier, 'input').inc(v === 0 ? 0 : 3);
    }
  } else {
    const h = new Histogram(config);
    const c = new Counter(counted);
    for (const [model, tier, v] of OBSERVED) {
      h.observe({ model, tier }, v);
      c.inc({ model, tier, type: 'output' }, 64);
      c.inc({ model, tier, type: 'input' }, v === 0 ? 0 : 3);
    }
  }
}

describe('held series', () => {
  it("expose the page and the JSON prom-client's Counter and Histogram expose for the same observations", async () => {
    const theirs = new Registry();
    const ours = new Registry();
    fill(theirs, false);
    fill(ours, true);
    const page = await ours.metrics();
    assert.match(page, /h_seconds_bucket\{le="\+Inf",model="m1",tier="flex"\} 1/, 'a series above every bound is in +Inf');
    assert.equal(page, await theirs.metrics());
    assert.deepEqual(await ours.getMetricsAsJSON(), await theirs.getMetricsAsJSON());
  });

  it('add up across processes as prom-client metrics do (the --processes scrape), count from one scrape to the next, and leave out what a counter cannot add', async () => {
    const a = new Registry();
    const b = new Registry();
    fill(a, true);
    fill(b, true);
    const merged = AggregatorRegistry.aggregate([await a.getMetricsAsJSON(), await b.getMetricsAsJSON()]);
    const page = await merged.metrics();
    assert.match(page, /h_seconds_count\{model="m1",tier="default"\} 8/);
    assert.match(page, /c_total\{model="m1",tier="default",type="output"\} 512/);
    // Increments after a scrape reach the next one (the counter's pending part is handed over once).
    const r = new Registry();
    const c = new HeldCounter({ name: 'c_total', help: 'a counter', labelNames: ['k'] as const, registers: [r] });
    const s = c.series('x');
    s.inc();
    assert.match(await r.metrics(), /c_total\{k="x"\} 1\n/);
    s.inc(2);
    assert.match(await r.metrics(), /c_total\{k="x"\} 3\n/);
    assert.match(await r.metrics(), /c_total\{k="x"\} 3\n/);
    // What a counter cannot add is left out (prom-client throws: a request's metrics must not fail it).
    s.inc(-1);
    s.inc(Number.NaN);
    s.inc(null as unknown as number);
    assert.match(await r.metrics(), /c_total\{k="x"\} 3\n/);
  });
});
