/** Admissions remembered per model for its service rate. */
export const RATE_SAMPLES = 32;

/** A model's recent admissions from its queue: the rate a Retry-After is computed from. Pure: the caller's clock. */
export class ServiceRate {
  private readonly at: number[] = [];

  /** One admission at `now` (ms). */
  admitted(now: number): void {
    this.at.push(now);
    if (this.at.length > RATE_SAMPLES) this.at.shift();
  }

  /** Admissions per second over the samples up to `now`; undefined before there are two. */
  perSecond(now: number): number | undefined {
    const n = this.at.length;
    if (n < 2) return undefined;
    const span = (now - this.at[0]!) / 1000;
    return span > 0 ? (n - 1) / span : undefined;
  }
}

/**
 * A queue 429's Retry-After, in seconds: when the `ahead` requests before a newcomer (and it) would
 * have been admitted at `rate`; without a rate, the queue timeout (a wait that long is what the
 * queue would have offered).
 */
export function queueRetryAfterS(ahead: number, rate: number | undefined, timeoutMs: number): number {
  return rate === undefined ? Math.max(1, Math.ceil(timeoutMs / 1000)) : Math.max(1, Math.ceil((ahead + 1) / rate));
}
