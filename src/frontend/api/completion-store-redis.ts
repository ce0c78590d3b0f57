import { EbbError } from '../../protocol/errors.js';
import type { RedisClient } from '../streams/redis-store.js';
import { matches, notStored, unknownCursor, type CompletionStore, type ListQuery, type Page, type StoredCompletion } from './completion-store.js';

/** Ids read per step of a list (a filtered list reads on until it has its page). */
const SCAN = 100;

/** A stored completion's key: its own slot, as a stream's keys (a Redis Cluster spreads them). */
const completionKey = (id: string) => `ebb:{${id}}:chat`;
/** A tenant's stored completions in the order they were stored (score: when, in ms). One slot for every tenant's index. */
const indexKey = (tenant: string) => `ebb:{chat-index}:${tenant}`;

/**
 * Stored chat completions in the fleet's shared store (--stream-store redis://...): any frontend
 * reads, updates, deletes and lists what any other stored. Each is one key that expires with
 * --response-ttl-ms; each tenant's index orders them for the list, pruned of what expired as it is
 * read and written. Redis away: the 503 that says so (stream_store_unavailable).
 */
export class RedisCompletionStore implements CompletionStore {
  constructor(
    private readonly redis: RedisClient,
    private readonly ttlMs: number,
  ) {}

  async put(c: StoredCompletion): Promise<void> {
    const index = indexKey(c.tenant);
    await this.op(() =>
      Promise.all([
        this.redis.set(completionKey(c.id), JSON.stringify(c), 'PX', this.ttlMs),
        this.redis.zadd(index, c.at, c.id),
        this.redis.zremrangebyscore(index, '-inf', c.at - this.ttlMs),
        this.redis.pexpire(index, this.ttlMs),
      ]),
    );
  }

  async get(id: string, tenant: string): Promise<StoredCompletion> {
    const c = await this.read(id);
    if (c === undefined || c.tenant !== tenant) throw notStored(id);
    return c;
  }

  async setMetadata(id: string, tenant: string, metadata: Record<string, string>): Promise<StoredCompletion> {
    const c = await this.get(id, tenant);
    c.completion = { ...c.completion, metadata };
    // XX: not brought back if it expired (or was deleted) meanwhile; KEEPTTL: it expires when it would have.
    const set = await this.op(() => this.redis.set(completionKey(id), JSON.stringify(c), 'KEEPTTL', 'XX'));
    if (set === null) throw notStored(id);
    return c;
  }

  async delete(id: string, tenant: string): Promise<void> {
    await this.get(id, tenant);
    await this.op(() => Promise.all([this.redis.del(completionKey(id)), this.redis.zrem(indexKey(tenant), id)]));
  }

  async list(tenant: string, q: ListQuery): Promise<Page<StoredCompletion>> {
    const index = indexKey(tenant);
    const desc = q.order === 'desc';
    let at = 0;
    if (q.after !== undefined) {
      const after = q.after;
      const rank = await this.op(() => (desc ? this.redis.zrevrank(index, after) : this.redis.zrank(index, after)));
      if (rank === null) throw unknownCursor(after);
      at = rank + 1;
    }
    const data: StoredCompletion[] = [];
    for (;;) {
      const from = at;
      const ids = await this.op(() => (desc ? this.redis.zrevrange(index, from, from + SCAN - 1) : this.redis.zrange(index, from, from + SCAN - 1)));
      if (ids.length === 0) return { data, hasMore: false };
      const found = await Promise.all(ids.map((id) => this.read(id)));
      const gone = ids.filter((_, i) => found[i] === undefined);
      // Expired since they were indexed: out of the index (the next step's ranks count without them).
      if (gone.length > 0) await this.op(() => this.redis.zrem(index, ...gone));
      for (const c of found) {
        if (c === undefined || c.tenant !== tenant || !matches(c, q)) continue;
        if (data.length === q.limit) return { data, hasMore: true };
        data.push(c);
      }
      at += ids.length - gone.length;
    }
  }

  private async read(id: string): Promise<StoredCompletion | undefined> {
    const raw = await this.op(() => this.redis.get(completionKey(id)));
    return raw === null ? undefined : (JSON.parse(raw) as StoredCompletion);
  }

  private async op<T>(run: () => Promise<T>): Promise<T> {
    try {
      return await run();
    } catch (err) {
      throw new EbbError('stream_store_unavailable', `the response store (Redis) cannot be reached: ${(err as Error).message}`);
    }
  }
}
