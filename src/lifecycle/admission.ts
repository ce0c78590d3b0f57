import { EventEmitter } from 'node:events';

/** Why a request was not admitted. Draining and overload are different answers with different retry advice. */
export type RefusalCode = 'worker_draining' | 'worker_overloaded';

/** How an admitted request ended. Exactly one of these is recorded per request. */
/** `handed_off`: stopped at a drain deadline, for the caller to continue on another worker. */
export type ReleaseOutcome = 'completed' | 'errored' | 'dropped' | 'handed_off';

export interface Ticket {
  readonly id: string;
  readonly admittedAt: number;
  /** Ends the request's tracking. Returns false (and changes nothing) if it was already released. */
  release(outcome: ReleaseOutcome): boolean;
}

export type AdmitResult = { admitted: true; ticket: Ticket } | { admitted: false; code: RefusalCode };

/**
 * The worker's one admission point. "Open and count+1" is a single synchronous step, so no request
 * can slip in between a drain closing admission and the drain reading the count.
 */
export class Admission extends EventEmitter {
  private isOpen = true;
  private readonly active = new Map<number, Ticket>();
  private seq = 0;

  constructor(private readonly isOverloaded: () => boolean = () => false) {
    super();
  }

  get open(): boolean {
    return this.isOpen;
  }

  get inflight(): number {
    return this.active.size;
  }

  /** Ids of what is still in flight, oldest first: what a drain or a shutdown waits for. */
  inflightIds(): string[] {
    return [...this.active.values()].map((t) => t.id);
  }

  close(): void {
    this.isOpen = false;
  }

  reopen(): void {
    this.isOpen = true;
  }

  admit(id: string): AdmitResult {
    if (!this.isOpen) return { admitted: false, code: 'worker_draining' };
    if (this.isOverloaded()) return { admitted: false, code: 'worker_overloaded' };
    const key = this.seq++;
    let released = false;
    const ticket: Ticket = {
      id,
      admittedAt: Date.now(),
      release: (outcome) => {
        if (released) return false;
        released = true;
        this.active.delete(key);
        this.emit('released', outcome);
        if (this.active.size === 0) this.emit('idle');
        return true;
      },
    };
    this.active.set(key, ticket);
    this.emit('admitted');
    return { admitted: true, ticket };
  }
}
