/**
 * A simulated engine's prefill compute: one budget of tokens per second per worker, shared equally
 * by the prefills running at once (processor sharing), as a GPU's compute is shared by the
 * sequences of one batch. Two prompts prefilled together each take twice as long as alone, so
 * cache misses and overload cost what they cost on a GPU. Time is what is simulated here: the
 * timer stands for the compute, it does not wait for an event.
 */
interface Job {
  /** Tokens left to prefill. */
  left: number;
  resolve: () => void;
}

/** Below this many tokens left a job counts as done (timer granularity). */
const EPSILON_TOKENS = 1e-6;

export class PrefillCompute {
  private readonly jobs = new Set<Job>();
  private last = performance.now();
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly tokensPerS: number) {}

  /** Prefills running now. */
  get running(): number {
    return this.jobs.size;
  }

  /** Tokens the running prefills still have to compute. */
  get tokensLeft(): number {
    this.advance();
    let n = 0;
    for (const j of this.jobs) n += j.left;
    return n;
  }

  /** Resolves once `tokens` are computed at this worker's shared rate; rejects when `signal` aborts. */
  run(tokens: number, signal: AbortSignal): Promise<void> {
    if (signal.aborted) return Promise.reject(signal.reason);
    if (tokens <= 0) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      this.advance();
      const onAbort = () => {
        this.advance();
        this.jobs.delete(job);
        this.schedule();
        reject(signal.reason);
      };
      const job: Job = {
        left: tokens,
        resolve: () => {
          signal.removeEventListener('abort', onAbort);
          resolve();
        },
      };
      signal.addEventListener('abort', onAbort, { once: true });
      this.jobs.add(job);
      this.schedule();
    });
  }

  /** Every running job computed its share of the time since the last change. */
  private advance(): void {
    const now = performance.now();
    if (this.jobs.size > 0) {
      const each = (((now - this.last) / 1000) * this.tokensPerS) / this.jobs.size;
      for (const j of this.jobs) j.left -= each;
    }
    this.last = now;
  }

  /** Finishes the jobs that are done and sets the timer for the next one to finish. */
  private schedule(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
    for (const j of [...this.jobs]) {
      if (j.left > EPSILON_TOKENS) continue;
      this.jobs.delete(j);
      j.resolve();
    }
    if (this.jobs.size === 0) return;
    let least = Infinity;
    for (const j of this.jobs) least = Math.min(least, j.left);
    const ms = (least * this.jobs.size * 1000) / this.tokensPerS;
    this.timer = setTimeout(() => {
      this.advance();
      // Timers fire at whole milliseconds: what is left of the job due now is rounding.
      for (const j of this.jobs) if (j.left <= (this.tokensPerS / 1000) * 0.5) j.left = 0;
      this.schedule();
    }, ms);
  }
}
