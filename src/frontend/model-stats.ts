/** The window the dashboard shows per model, in one-second slots. */
export const MODEL_STATS_WINDOW_S = 60;
/** Request rate is over the last this many seconds (a rate over a whole minute lags too much). */
export const RATE_WINDOW_S = 10;
/** Models tracked at most (a model name comes from the client; past this, new names are not counted). */
const MAX_MODELS = 256;
/** TTFTs kept per slot for percentiles (a sample under heavy load). */
const TTFTS_PER_SLOT = 64;

interface Slot {
  second: number;
  requests: number;
  errors: number;
  shed: number;
  ttfts: number[];
}

export interface ModelSummary {
  model: string;
  /** Requests answered per second over the last RATE_WINDOW_S. */
  requests_per_s: number;
  /** Requests answered over the window. */
  requests: number;
  /** Of those, answered 5xx or 429 (the fleet could not serve them; a client's other 4xx is not counted). */
  errors: number;
  /** Of the errors, the 429s: requests the admission queue shed (full, or waited out its timeout). */
  shed: number;
  /** Time to first token of streamed answers over the window, ms; null without any. */
  ttft_p50_ms: number | null;
  ttft_p95_ms: number | null;
  /** Requests per second, oldest first, one per second of the window. */
  rate_series: number[];
  /** Requests waiting in the admission queue now (0 without one). */
  queued: number;
  /** The same by tier (continuation, priority, default, flex); only tiers with waiters. */
  queued_by_tier: Record<string, number>;
}

/**
 * Per-model request rate, errors and time to first token over the last minute, as this frontend
 * saw them, for its dashboard (Prometheus has the long view: ebb_frontend_*). O(1) per request;
 * memory bounded by models x window.
 */
export class ModelStats {
  private readonly models = new Map<string, Slot[]>();
  /** Requests of a model waiting in the admission queue now (set where there is one). */
  queued: (model: string) => number = () => 0;
  /** The same by tier (set where there is a queue). */
  queuedByTier: (model: string) => Record<string, number> = () => ({});

  answered(model: string, status: number, now = Date.now()): void {
    const slot = this.slot(model, now);
    if (!slot) return;
    slot.requests++;
    // A shed (429) is the fleet's want of capacity, as a 503 is: an error to whoever watches the fleet.
    if (status >= 500 || status === 429) slot.errors++;
    if (status === 429) slot.shed++;
  }

  firstToken(model: string, seconds: number, now = Date.now()): void {
    const slot = this.slot(model, now);
    if (slot && slot.ttfts.length < TTFTS_PER_SLOT) slot.ttfts.push(seconds * 1000);
  }

  summary(now = Date.now()): ModelSummary[] {
    const current = Math.floor(now / 1000);
    const out: ModelSummary[] = [];
    for (const [model, slots] of this.models) {
      const live = slots.filter((s) => s.second > current - MODEL_STATS_WINDOW_S);
      if (live.length === 0) {
        this.models.delete(model);
        continue;
      }
      // The current second is partial: rates count whole seconds only.
      const rate_series = Array.from({ length: MODEL_STATS_WINDOW_S }, (_, i) => live.find((s) => s.second === current - MODEL_STATS_WINDOW_S + i)?.requests ?? 0);
      const ttfts = live.flatMap((s) => s.ttfts).sort((a, b) => a - b);
      const pct = (p: number) => (ttfts.length ? Math.round((ttfts[Math.min(ttfts.length - 1, Math.floor(p * ttfts.length))] as number) * 10) / 10 : null);
      out.push({
        model,
        requests_per_s: Math.round((rate_series.slice(-RATE_WINDOW_S).reduce((a, b) => a + b, 0) / RATE_WINDOW_S) * 10) / 10,
        requests: live.reduce((a, s) => a + s.requests, 0),
        errors: live.reduce((a, s) => a + s.errors, 0),
        shed: live.reduce((a, s) => a + s.shed, 0),
        ttft_p50_ms: pct(0.5),
        ttft_p95_ms: pct(0.95),
        rate_series,
        queued: this.queued(model),
        queued_by_tier: this.queuedByTier(model),
      });
    }
    return out.sort((a, b) => a.model.localeCompare(b.model));
  }

  private slot(model: string, now: number): Slot | undefined {
    const second = Math.floor(now / 1000);
    let slots = this.models.get(model);
    if (!slots) {
      if (this.models.size >= MAX_MODELS) return undefined;
      this.models.set(model, (slots = []));
    }
    let last = slots[slots.length - 1];
    if (!last || last.second !== second) {
      slots.push((last = { second, requests: 0, errors: 0, shed: 0, ttfts: [] }));
      while ((slots[0] as Slot).second <= second - MODEL_STATS_WINDOW_S) slots.shift();
    }
    return last;
  }
}
