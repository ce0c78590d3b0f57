import type { RequestTier } from '../protocol/request-plane.js';
import type { Quiescence } from './engine.js';

/** Waiters' order by tier: priority, then default, then flex (first come, first served within one). */
const TIER_RANK: Record<RequestTier, number> = { priority: 0, default: 1, flex: 2 };

/**
 * Counting semaphore for batch slots, its queue served by tier (FIFO within one); a waiter whose signal aborts leaves the queue. Its
 * change listeners run whenever running or queued went down (a release, a queued waiter dropped),
 * or the engine says something else its idleness probe reads changed (`changed`): a drain may be
 * waiting for exactly that. What an in-process engine (mocker, llama-cpp) counts of its load.
 */
export class Slots {
  private free: number;
  private readonly waiters: Array<{ rank: number; grant: () => void }> = [];
  private readonly listeners = new Set<() => void>();

  constructor(readonly capacity: number) {
    this.free = capacity;
  }

  /** The engine's onQuiescenceChange: `listener` runs on each change; returns its remover. */
  onChange(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Something else the idleness probe reads changed (a KV transfer pulled or expired). */
  changed(): void {
    for (const l of [...this.listeners]) l();
  }

  /** The sequence counts of EngineStats. */
  get stats(): { running_sequences: number; queued_sequences: number; queued_priority_sequences: number; batch_slots: number } {
    return { running_sequences: this.running, queued_sequences: this.queued, queued_priority_sequences: this.queuedPriority, batch_slots: this.capacity };
  }

  /** Priority waiters (first in the queue): a new priority request gets a slot after they do. */
  get queuedPriority(): number {
    let n = 0;
    while (n < this.waiters.length && this.waiters[n]!.rank === TIER_RANK.priority) n++;
    return n;
  }

  get queued(): number {
    return this.waiters.length;
  }

  get running(): number {
    return this.capacity - this.free;
  }

  acquire(signal: AbortSignal, tier: RequestTier = 'default'): Promise<void> {
    if (signal.aborted) return Promise.reject(signal.reason);
    if (this.free > 0 && this.waiters.length === 0) {
      this.free--;
      return Promise.resolve();
    }
    return new Promise<void>((resolve, reject) => {
      const waiter = {
        rank: TIER_RANK[tier],
        grant: () => {
          signal.removeEventListener('abort', onAbort);
          resolve();
        },
      };
      const onAbort = () => {
        const i = this.waiters.indexOf(waiter);
        if (i >= 0) this.waiters.splice(i, 1);
        reject(signal.reason);
        this.changed();
      };
      signal.addEventListener('abort', onAbort, { once: true });
      // Behind every waiter of its tier or a higher one.
      let i = this.waiters.length;
      while (i > 0 && this.waiters[i - 1]!.rank > waiter.rank) i--;
      this.waiters.splice(i, 0, waiter);
    });
  }

  release(): void {
    const next = this.waiters.shift();
    if (next) next.grant();
    else this.free++;
    this.changed();
  }
}

/**
 * An in-process engine's idleness, from what it can count itself: its sequences (running and
 * queued) and the KV transfers peers have yet to pull (leaving before they do would lose them).
 */
export function slotQuiescence(slots: Slots, kvTransfersPending: number): Quiescence {
  const { running, queued } = slots;
  const waiting: string[] = [];
  if (running > 0 || queued > 0) waiting.push(`engine: ${running} running, ${queued} queued sequences`);
  if (kvTransfersPending > 0) waiting.push(`${kvTransfersPending} pending KV transfer${kvTransfersPending === 1 ? '' : 's'}`);
  return waiting.length === 0 ? { state: 'idle' } : { state: 'busy', waiting_for: waiting };
}
