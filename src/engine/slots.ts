/**
 * FIFO counting semaphore for batch slots; a waiter whose signal aborts leaves the queue.
 * `onChange` runs whenever running or queued went down (a release, a queued waiter dropped): what an
 * engine's idleness probe reads changed, and a drain may be waiting for exactly that.
 */
export class Slots {
  private free: number;
  private readonly waiters: Array<{ grant: () => void }> = [];

  constructor(
    readonly capacity: number,
    private readonly onChange: () => void = () => undefined,
  ) {
    this.free = capacity;
  }

  get queued(): number {
    return this.waiters.length;
  }

  get running(): number {
    return this.capacity - this.free;
  }

  acquire(signal: AbortSignal): Promise<void> {
    if (signal.aborted) return Promise.reject(signal.reason);
    if (this.free > 0 && this.waiters.length === 0) {
      this.free--;
      return Promise.resolve();
    }
    return new Promise<void>((resolve, reject) => {
      const waiter = {
        grant: () => {
          signal.removeEventListener('abort', onAbort);
          resolve();
        },
      };
      const onAbort = () => {
        const i = this.waiters.indexOf(waiter);
        if (i >= 0) this.waiters.splice(i, 1);
        reject(signal.reason);
        this.onChange();
      };
      signal.addEventListener('abort', onAbort, { once: true });
      this.waiters.push(waiter);
    });
  }

  release(): void {
    const next = this.waiters.shift();
    if (next) next.grant();
    else this.free++;
    this.onChange();
  }
}
