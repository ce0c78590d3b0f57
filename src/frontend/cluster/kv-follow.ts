import type { WorkerRecord } from '../../discovery/discovery.js';
import { StreamBroken, type KvEventSource } from '../routing/kv-subscription.js';
import type { ChildMessage, PrimaryMessage } from './messages.js';

/** Events the primary may have sent ahead of a child that is busy; past this the child resubscribes. */
const MAX_QUEUED = 10_000;

type Item = { event: string; data: unknown };

/** One follow of one worker's stream: what the primary sent, read in order by the subscription. */
class Follow {
  private readonly items: Item[] = [];
  private waiting: (() => void) | undefined;
  private ended: { reason: string | undefined } | undefined;

  constructor(readonly id: number) {}

  push(item: Item): void {
    if (this.ended) return;
    if (this.items.length >= MAX_QUEUED) return this.end(`more than ${MAX_QUEUED} KV events unread`);
    this.items.push(item);
    this.wake();
  }

  end(reason: string | undefined): void {
    this.ended ??= { reason };
    this.wake();
  }

  private wake(): void {
    const w = this.waiting;
    this.waiting = undefined;
    w?.();
  }

  async *read(): AsyncGenerator<Item, void, void> {
    for (;;) {
      const item = this.items.shift();
      if (item !== undefined) {
        yield item;
        continue;
      }
      if (this.ended) {
        if (this.ended.reason !== undefined) throw new StreamBroken(this.ended.reason);
        return;
      }
      await new Promise<void>((resolve) => (this.waiting = resolve));
    }
  }
}

/**
 * A child's side of the one KV subscription per frontend host: instead of opening its own GET
 * /kv/events on every worker (a fleet of 16 frontends x 4 processes held 64 streams per worker),
 * a child of `--processes N` follows the primary's stream (cluster/kv-relay.ts): a snapshot of what
 * the primary holds, then the worker's batches as the primary applies them. Its subscription reads
 * them exactly as it would read the worker (the snapshot first, seq consecutive), and reconnects
 * the same way when the primary says the stream ended.
 */
export class KvFollower {
  private readonly follows = new Map<string, Follow>();
  private nextId = 0;

  constructor(private readonly send: (m: ChildMessage) => void) {}

  source(record: WorkerRecord): KvEventSource {
    return (signal) => this.follow(record, signal);
  }

  /** The primary's kv messages; others are not this follower's. */
  onMessage(m: PrimaryMessage): void {
    if (m.type !== 'ebb:kv-event' && m.type !== 'ebb:kv-end') return;
    const f = this.follows.get(m.worker_id);
    if (f === undefined || f.id !== m.follow) return; // a late message of an earlier follow
    if (m.type === 'ebb:kv-event') f.push({ event: m.event, data: m.data });
    else f.end(m.reason);
  }

  private async *follow(record: WorkerRecord, signal: AbortSignal): AsyncGenerator<Item, void, void> {
    const workerId = record.worker_id;
    this.follows.get(workerId)?.end('followed again');
    const f = new Follow(this.nextId++);
    this.follows.set(workerId, f);
    const stop = () => f.end(undefined);
    signal.addEventListener('abort', stop, { once: true });
    this.send({ type: 'ebb:kv-follow', worker_id: workerId, system_url: record.system_url, follow: f.id });
    try {
      yield* f.read();
    } finally {
      signal.removeEventListener('abort', stop);
      if (this.follows.get(workerId) === f) {
        this.follows.delete(workerId);
        this.send({ type: 'ebb:kv-unfollow', worker_id: workerId, follow: f.id });
      }
    }
  }
}
