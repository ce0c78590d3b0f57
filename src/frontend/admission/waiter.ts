import type { Charge } from './fair-share.js';
import { SERVICE_TIERS, type ServiceTier, type StreamHold, type Ticket } from './ticket.js';

/** A continuation (a stream moving off a worker) has a client mid-answer: it goes before every tier. */
export type Class = 'continuation' | ServiceTier;
export const CLASSES: readonly Class[] = ['continuation', ...SERVICE_TIERS];

/** How a waiter left the queue: a worker took it, it left (its client, or another answer), or the queue shed it (429). */
export type Outcome = 'admitted' | 'left' | 'shed';

/**
 * Where a request is in its model's queue:
 * - waiting: for a turn;
 * - trying: granted one (its tenant charged), it is trying the workers; `since` is the queue's
 *   change count then, so a change during the try is not lost;
 * - parked: its turn found no worker that takes what it needs (`need`); it waits for a change;
 * - gone: out of the queue, for good.
 */
export type WaiterState =
  | { kind: 'waiting' }
  | { kind: 'trying'; since: number; charge: Charge }
  | { kind: 'parked'; need: string; since: number }
  | { kind: 'gone'; outcome: Outcome; error?: unknown };

/** A request's place in its model's queue, as the request holds it: from its first failed pick until it is admitted or leaves. */
export interface Place {
  /** Resolves when it is this request's turn to try the workers; rejects (429, 503, abort) when it will get none. */
  turn(): Promise<void>;
  /** A worker took it: it leaves the queue, and the next one gets its turn. */
  admitted(): void;
  /** Its turn found no worker that takes it: it waits for the fleet to change, and its turn passes on. */
  refused(): void;
  /** It leaves with another answer (the client's error, a failure of its own). */
  leave(): void;
  /** Why it left with its client (or its generation) gone, if it did: a worker that takes it now serves nobody. */
  readonly clientGone: unknown;
}

/** The one owner of waiters' states (a model's queue): it decides every move, and its counts follow each. */
export interface WaiterOwner {
  /** Bookkeeping for a move of `w` out of `from` (its state is already the new one). */
  moved(w: Waiter, from: WaiterState): void;
  admit(w: Waiter): void;
  refuse(w: Waiter): void;
  /** Its turn found its tenant's concurrent streams all taken: it waits for a change, and its tenant's other waiters with it. */
  tenantFull(w: Waiter): void;
  leave(w: Waiter, outcome: Outcome, error?: unknown): void;
  /** Its queue timeout passed. */
  expire(w: Waiter): void;
}

/**
 * One request waiting in the admission queue: ONE state (WaiterState), set by ONE setter (set),
 * which only its owner calls. It leaves at once when its generation's signal or its client's aborts,
 * and is shed at its queue timeout (never before: a timer that fires early waits out the rest).
 */
export class Waiter implements Place {
  readonly enteredAt = performance.now();
  #state: WaiterState = { kind: 'waiting' };
  private wake: { resolve: () => void; reject: (err: unknown) => void } | undefined;
  private timer: NodeJS.Timeout | undefined;
  private readonly signals: AbortSignal[];
  private readonly onAbort = (e: Event) => this.owner.leave(this, 'left', (e.target as AbortSignal).reason);

  constructor(
    private readonly owner: WaiterOwner,
    readonly cls: Class,
    readonly ticket: Ticket,
    /** What a worker must offer to take it: waiters that need alike are refused alike. */
    readonly need: string,
    signals: ReadonlyArray<AbortSignal | undefined>,
    private readonly timeoutMs: number,
  ) {
    this.signals = signals.filter((s): s is AbortSignal => s !== undefined);
    for (const s of this.signals) s.addEventListener('abort', this.onAbort, { once: true });
    this.arm(timeoutMs);
  }

  get state(): WaiterState {
    return this.#state;
  }

  /** The one setter; its owner alone calls it. Gone is final. */
  set(next: WaiterState): void {
    const from = this.#state;
    if (from.kind === 'gone') return;
    this.#state = next;
    this.owner.moved(this, from);
    const w = this.wake;
    if (next.kind === 'trying') {
      this.wake = undefined;
      w?.resolve();
    } else if (next.kind === 'gone') {
      this.wake = undefined;
      clearTimeout(this.timer);
      for (const s of this.signals) s.removeEventListener('abort', this.onAbort);
      if (next.error !== undefined) w?.reject(next.error);
    }
  }

  turn(): Promise<void> {
    const hold = this.ticket.hold;
    return hold === undefined ? this.granted() : this.retake(hold);
  }

  private granted(): Promise<void> {
    const s = this.#state;
    if (s.kind === 'trying') return Promise.resolve();
    if (s.kind === 'gone') return Promise.reject(s.error ?? new Error(`the request is out of the queue (${s.outcome})`));
    return new Promise((resolve, reject) => (this.wake = { resolve, reject }));
  }

  /**
   * Its turn, with its tenant's stream slot taken again; none free, its turn passes on and it waits
   * for the next change (its tenant's streams are full until one ends).
   */
  private async retake(hold: StreamHold): Promise<void> {
    for (;;) {
      await this.granted();
      let taken: boolean;
      try {
        taken = await hold.turn();
      } catch (err) {
        this.owner.leave(this, 'shed', err);
        throw err;
      }
      if (taken) return;
      this.owner.tenantFull(this);
    }
  }

  admitted(): void {
    this.owner.admit(this);
  }

  refused(): void {
    // Back to waiting: its tenant's stream slot goes back again until its next turn.
    this.ticket.hold?.queued();
    this.owner.refuse(this);
  }

  leave(): void {
    this.owner.leave(this, 'left');
  }

  get clientGone(): unknown {
    const s = this.#state;
    return s.kind === 'gone' && s.outcome === 'left' ? s.error : undefined;
  }

  /** The queue timeout counts from its entry: a timer that fires early (a stale loop clock) is re-armed for the rest. */
  private arm(ms: number): void {
    this.timer = setTimeout(() => {
      const rest = this.timeoutMs - (performance.now() - this.enteredAt);
      if (rest > 0) this.arm(Math.ceil(rest));
      else this.owner.expire(this);
    }, ms);
  }
}
