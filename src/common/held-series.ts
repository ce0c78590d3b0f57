import { Counter, type CounterConfiguration, type Registry } from 'prom-client';

/*
 * Counters and histograms whose series a hot path holds. prom-client hashes and checks the label
 * object on every inc and observe (about 1 µs each; a chat request made seven such calls, 6.5 µs of
 * the frontend's CPU per request): a held series is found once by its label values and then only
 * adds. Both are exposed through the same Registry as prom-client's own metrics and in their format,
 * so /metrics, the --processes aggregation and promtool read them as before.
 */

/** A series' label values in the metric's label order: its key in the metric's map. */
const keyOf = (values: readonly string[]) => (values.length === 1 ? values[0]! : values.join('\u0000'));

/** One counter series: what it added since the last scrape, given to prom-client at the next. */
export interface CounterSeries {
  inc(value?: number): void;
}

class HeldCount implements CounterSeries {
  pending = 0;
  constructor(readonly labels: Record<string, string>) {}

  // What a counter cannot add (negative, not a finite number) is left out: a metric never fails the request it counts.
  inc(value = 1): void {
    if (value >= 0 && Number.isFinite(value)) this.pending += value;
  }
}

/** A prom-client Counter whose series are held: their increments reach prom-client when it is scraped. */
export class HeldCounter<L extends string> extends Counter<L> {
  private readonly held = new Map<string, HeldCount>();
  private readonly names: readonly L[];

  constructor(config: Omit<CounterConfiguration<L>, 'collect' | 'labelNames'> & { labelNames: readonly L[] }) {
    super({
      ...config,
      collect() {
        (this as HeldCounter<L>).flush();
      },
    });
    this.names = config.labelNames;
  }

  /** At a scrape: what the series added since the last, through prom-client's own inc (a scrape's cost, not a request's). */
  private flush(): void {
    for (const s of this.held.values()) {
      if (s.pending === 0) continue;
      this.inc(s.labels as Partial<Record<L, string>>, s.pending);
      s.pending = 0;
    }
  }

  /** The series of these label values (in labelNames' order), made at its first use. */
  series(...values: string[]): CounterSeries {
    const key = keyOf(values);
    let s = this.held.get(key);
    if (s === undefined) {
      s = new HeldCount(Object.fromEntries(this.names.map((name, i) => [name, values[i]!])));
      this.held.set(key, s);
      // Shown from its first use, at 0 until it counts.
      this.inc(s.labels as Partial<Record<L, string>>, 0);
    }
    return s;
  }
}

/** One histogram series. */
export interface HistogramSeries {
  observe(value: number): void;
}

/** A sample as prom-client's registry reads it. */
interface ExposedValue {
  labels: Record<string, string | number>;
  sharedLabels?: Record<string, string>;
  value: number;
  metricName: string;
  /** prom-client's (null on a bucket, undefined on _sum and _count): none here. */
  exemplar: null | undefined;
}

interface Exposed {
  name: string;
  help: string;
  type: 'histogram';
  values: ExposedValue[];
  aggregator: 'sum';
}

class HistogramData implements HistogramSeries {
  /** Observations per bucket (not cumulative), the last for those above every bound. */
  readonly counts: number[];
  sum = 0;
  count = 0;

  constructor(
    readonly labels: Record<string, string>,
    private readonly bounds: readonly number[],
  ) {
    this.counts = new Array<number>(bounds.length + 1).fill(0);
  }

  observe(value: number): void {
    if (!Number.isFinite(value)) return; // as a counter's: never the request's failure
    let i = 0;
    while (i < this.bounds.length && value > this.bounds[i]!) i++;
    this.counts[i]!++;
    this.sum += value;
    this.count++;
  }
}

/**
 * A histogram of held series, shown as prom-client's Histogram shows one (its get() and
 * getForPromString() shapes: cumulative `_bucket` values with `le`, then +Inf, `_sum`, `_count`).
 */
export class HeldHistogram<L extends string> {
  readonly type = 'histogram';
  readonly aggregator = 'sum' as const;
  readonly name: string;
  readonly help: string;
  private readonly labelNames: readonly L[];
  private readonly buckets: readonly number[];
  private readonly series_ = new Map<string, HistogramData>();

  constructor(config: { name: string; help: string; labelNames: readonly L[]; buckets: readonly number[]; registers: Registry[] }) {
    this.name = config.name;
    this.help = config.help;
    this.labelNames = config.labelNames;
    this.buckets = [...config.buckets].sort((a, b) => a - b);
    for (const r of config.registers) r.registerMetric(this as never);
  }

  /** The series of these label values (in labelNames' order), made at its first use. */
  series(...values: string[]): HistogramSeries {
    const key = keyOf(values);
    let d = this.series_.get(key);
    if (d === undefined) {
      d = new HistogramData(Object.fromEntries(this.labelNames.map((name, i) => [name, values[i]!])), this.buckets);
      this.series_.set(key, d);
    }
    return d;
  }

  /** Every series back to 0, kept (its holders keep adding to it): prom-client's reset drops them. */
  reset(): void {
    for (const d of this.series_.values()) {
      d.counts.fill(0);
      d.sum = 0;
      d.count = 0;
    }
  }

  /** prom-client's histogram shape for the text page: the series' labels apart (sharedLabels). */
  getForPromString(): Exposed {
    const values: ExposedValue[] = [];
    const bucket = `${this.name}_bucket`;
    for (const d of this.series_.values()) {
      let acc = 0;
      this.buckets.forEach((le, i) => {
        acc += d.counts[i]!;
        values.push({ labels: { le }, sharedLabels: d.labels, value: acc, metricName: bucket, exemplar: null });
      });
      values.push({ labels: { le: '+Inf' }, sharedLabels: d.labels, value: d.count, metricName: bucket, exemplar: null });
      values.push({ labels: {}, sharedLabels: d.labels, value: d.sum, metricName: `${this.name}_sum`, exemplar: undefined });
      values.push({ labels: {}, sharedLabels: d.labels, value: d.count, metricName: `${this.name}_count`, exemplar: undefined });
    }
    return { name: this.name, help: this.help, type: this.type, values, aggregator: this.aggregator };
  }

  /** prom-client's get(): each value's labels whole (what the --processes aggregation merges). */
  get(): Promise<Exposed> {
    const data = this.getForPromString();
    data.values = data.values.map(({ sharedLabels, ...rest }) => ({ ...rest, labels: { ...rest.labels, ...sharedLabels } }));
    return Promise.resolve(data);
  }
}
