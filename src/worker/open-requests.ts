import { estimateDrainMs, TokenPace } from './drain-eta.js';
import type { RequestScope } from './request-scope.js';

/**
 * The request plane's admitted requests whose scope is still open: what a shutdown cuts, what a
 * drain deadline hands off (generations only: a prefill is short and finishes where it runs), and
 * what the drain ETA counts down. Scopes are kept in admission order, the engine's FIFO order.
 */
export class OpenRequests {
  private readonly scopes = new Set<RequestScope>();
  private readonly generations = new Set<RequestScope>();
  private readonly closeWaiters = new Set<() => void>();
  /** The engine's token pace, from every generation's pieces. */
  readonly pace = new TokenPace();

  /** Given to each scope: called once when it closes, however its request ended. */
  readonly onClose = (s: RequestScope): void => {
    this.scopes.delete(s);
    this.generations.delete(s);
    for (const w of this.closeWaiters) w();
  };

  get size(): number {
    return this.scopes.size;
  }

  add(scope: RequestScope): void {
    this.scopes.add(scope);
  }

  /** The scope is a /generate: a drain deadline can hand it off. */
  generating(scope: RequestScope): void {
    this.generations.add(scope);
  }

  /** Shutdown deadline: cut every open request; resolves once all are closed, or `signal` aborts. */
  cutAll(signal: AbortSignal): Promise<void> {
    const these = [...this.scopes];
    for (const s of these) s.cut();
    return this.whenClosed(these, signal);
  }

  /** Drain deadline: hand off every open generation; `closed` settles once they are released. */
  handOffAll(): { count: number; closed: Promise<void> } {
    const these = [...this.generations];
    for (const s of these) s.handOff();
    return { count: these.length, closed: this.whenClosed(these) };
  }

  /**
   * The flex generation a priority request may pause: one its caller lets be preempted, running
   * (it has produced a token, so it holds a batch slot) and not stopping already; the one with the
   * fewest tokens (the least to evaluate again where its state is not carried).
   */
  preemptible(): RequestScope | undefined {
    let out: RequestScope | undefined;
    for (const s of this.generations) if (s.preemptible && s.generated > 0 && !s.signal.aborted && (out === undefined || s.generated < out.generated)) out = s;
    return out;
  }

  drainEta(batchSlots: number): number | null {
    // A prefill in flight (no tokens to count) has no estimate here.
    if (this.scopes.size > this.generations.size) return null;
    const progress = [...this.generations].map((s) => ({ budget: s.budget, generated: s.generated }));
    return estimateDrainMs(progress, this.pace, batchSlots);
  }

  /** Resolves once none of `these` is open any more, or `signal` aborts. */
  private whenClosed(these: RequestScope[], signal?: AbortSignal): Promise<void> {
    return new Promise<void>((resolve) => {
      const check = () => {
        if (these.every((s) => !this.scopes.has(s))) {
          this.closeWaiters.delete(check);
          resolve();
        }
      };
      this.closeWaiters.add(check);
      signal?.addEventListener(
        'abort',
        () => {
          this.closeWaiters.delete(check);
          resolve();
        },
        { once: true },
      );
      check();
    });
  }
}
