import type { Worker } from 'node:cluster';
import type { KvFeed, KvFeedTap } from '../routing/kv-feed.js';
import type { PrimaryMessage } from './messages.js';

/**
 * The primary's side of the one KV subscription per frontend host: the primary's own KvFeed holds
 * the one GET /kv/events per worker, and each child that follows a worker (cluster/kv-follow.ts) is
 * sent a snapshot of what the primary holds now, then every batch the primary applies. When the
 * primary's stream breaks, or restarts with a new snapshot, its followers are told it ended and
 * follow again, as a direct subscriber would reconnect.
 */
export class KvRelay {
  /** Per worker id: the children following it, with the id of their follow. */
  private readonly followers = new Map<string, Map<Worker, number>>();
  private feed: KvFeed | undefined;

  readonly tap: KvFeedTap = {
    event: (sub, event, data) => {
      const id = sub.record.worker_id;
      // A new snapshot is a new stream: followers start again from it.
      if (event === 'snapshot') return this.endAll(id, 'the primary reconnected to the worker');
      for (const [child, follow] of this.followers.get(id) ?? []) this.tell(child, { type: 'ebb:kv-event', worker_id: id, follow, event, data });
    },
    broken: (workerId, reason) => this.endAll(workerId, reason),
  };

  constructor(private readonly tell: (w: Worker, m: PrimaryMessage) => void) {}

  /** The feed whose streams are relayed (created with this relay's tap). */
  attach(feed: KvFeed): void {
    this.feed = feed;
  }

  follow(child: Worker, workerId: string, systemUrl: string, follow: number): void {
    const held = this.feed?.snapshotOf(workerId);
    if (held === undefined || held.record.system_url !== systemUrl) {
      const reason = held === undefined ? "the primary holds no KV stream of it yet" : `the primary follows it at ${held.record.system_url}`;
      this.tell(child, { type: 'ebb:kv-end', worker_id: workerId, follow, reason });
      return;
    }
    let children = this.followers.get(workerId);
    if (children === undefined) this.followers.set(workerId, (children = new Map()));
    children.set(child, follow);
    this.tell(child, { type: 'ebb:kv-event', worker_id: workerId, follow, event: 'snapshot', data: held.snapshot });
  }

  unfollow(child: Worker, workerId: string, follow: number): void {
    const children = this.followers.get(workerId);
    if (children?.get(child) !== follow) return;
    children.delete(child);
    if (children.size === 0) this.followers.delete(workerId);
  }

  childGone(child: Worker): void {
    for (const [id, children] of this.followers) {
      children.delete(child);
      if (children.size === 0) this.followers.delete(id);
    }
  }

  private endAll(workerId: string, reason: string): void {
    const children = this.followers.get(workerId);
    if (children === undefined) return;
    this.followers.delete(workerId);
    for (const [child, follow] of children) this.tell(child, { type: 'ebb:kv-end', worker_id: workerId, follow, reason });
  }
}
