import { EbbError } from '../../protocol/errors.js';
import type { ServerResponse } from 'node:http';
import { KeptStream, type KeptStreamHooks, type ResumeFrom } from './kept-stream.js';
import type { SharedStreams, TakenStream } from './shared-streams.js';

export interface StreamStoreOptions {
  /** How long an ended stream stays resumable (OpenAI keeps 5 minutes). */
  windowMs: number;
  /** How long a stored Responses API response stays retrievable (GET, previous_response_id) after it ended. */
  responseTtlMs: number;
  /** How long a generation runs on after its client left, for a resume (0: cancelled at once, as before). */
  graceMs: number;
  /** One stream's bound: a longer one is served, not kept. */
  maxResponseBytes: number;
  /** All kept streams' bound: the oldest ended ones are forgotten first. */
  maxTotalBytes: number;
  /** Kept streams at most (ended ones forgotten first, oldest first). */
  maxStreams: number;
  writeTimeoutMs: number;
  /** A store shared by a fleet of frontends (redis-store.ts names the URL forms); undefined: this process's memory alone. */
  redisUrl?: string | undefined;
  /** The store's password (--stream-store-password-file, $EBB_STREAM_STORE_PASSWORD), kept out of the URL. */
  redisPassword?: string | undefined;
}

export const STREAM_STORE_DEFAULTS: StreamStoreOptions = {
  windowMs: 5 * 60_000,
  responseTtlMs: 60 * 60_000,
  graceMs: 15_000,
  maxResponseBytes: 8 << 20,
  maxTotalBytes: 256 << 20,
  maxStreams: 10_000,
  writeTimeoutMs: 30_000,
};

/** Ids forgotten, remembered this long as expired (so a late resume hears "expired", not "never heard of it"). */
const EXPIRED_MEMORY = 50_000;

export interface StreamStoreMetrics {
  /** What the store holds, read at each scrape (not told at each event: that is the hot path). */
  watch(store: { keptBytes: number; size: number }): void;
  /** What the Responses API's records hold, likewise. */
  watchResponses(records: { keptBytes: number; size: number }): void;
  abandoned(id: string, events: number): void;
  forgotten(reason: 'window' | 'bytes' | 'count'): void;
  resume(outcome: 'resumed' | 'not_found' | 'expired'): void;
}

/**
 * The frontend's kept streams (the embedded default: this process's memory), bounded in bytes per
 * stream and in all, and in count; each ended one is kept for the resume window, then forgotten
 * (its id remembered as expired for a while). Live streams are never forgotten: their generation
 * and followers own them until they end.
 */
export class StreamStore {
  private readonly streams = new Map<string, KeptStream>();
  /** Ended streams in the order they ended: the first to forget. */
  private readonly ended = new Set<KeptStream>();
  private readonly expired = new Set<string>();
  private bytes = 0;
  private sweeper: NodeJS.Timeout | undefined;
  /** One for every stream it keeps (an ended stream is held for the resume window: nothing of its own it can do without). */
  private readonly hooks: KeptStreamHooks;

  constructor(
    readonly opts: StreamStoreOptions,
    private readonly metrics?: StreamStoreMetrics,
    /** A fleet's shared store: every kept stream is copied there, and resumes of streams kept elsewhere read it. */
    readonly shared?: SharedStreams | undefined,
  ) {
    metrics?.watch(this);
    this.hooks = {
      maxBytes: opts.maxResponseBytes,
      graceMs: opts.graceMs,
      writeTimeoutMs: opts.writeTimeoutMs,
      onBytes: (delta) => {
        this.bytes += delta;
        if (delta > 0 && this.bytes > opts.maxTotalBytes) this.forgetOldest('bytes', () => this.bytes > opts.maxTotalBytes);
      },
      onOver: (s) => {
        this.ended.add(s);
        this.sweepLater();
      },
      onAbandoned: (s, events) => metrics?.abandoned(s.id, events),
    };
  }

  /**
   * A new stream to keep, under `id` (a response id: chatcmpl-, cmpl-, resp_), for `tenant`; in a
   * fleet copied to the shared store with its `plan` (how another frontend would continue it; made
   * only then: a frontend's own memory does not need it).
   */
  open(id: string, tenant: string, plan: () => string): KeptStream {
    const lease = this.shared?.healthy === true ? this.shared.open(id, plan(), tenant) : undefined;
    return this.keep(id, tenant, lease);
  }

  /**
   * A stream taken over from a frontend that went away: kept here from now on, its earlier events
   * (as the store had them) first; it runs to its end with nobody following here, as a background one.
   */
  adopt(taken: TakenStream): KeptStream {
    const stream = this.keep(taken.id, taken.tenant, taken.lease);
    stream.seed(taken.copy.events);
    stream.detach();
    return stream;
  }

  private keep(id: string, tenant: string, lease: KeptStream['lease']): KeptStream {
    const stream = new KeptStream(id, this.hooks, tenant, lease);
    const before = this.streams.get(id);
    if (before !== undefined) {
      // Taken back over (this frontend had lost it): the new run replaces the old.
      this.ended.delete(before);
      before.drop();
    }
    this.streams.set(id, stream);
    if (this.streams.size > this.opts.maxStreams) this.forgetOldest('count', () => this.streams.size > this.opts.maxStreams);
    return stream;
  }

  /** The kept stream `id` of `tenant`, or the 404 saying why there is none (another tenant's is none). */
  get(id: string, tenant: string): KeptStream {
    this.sweep();
    const stream = this.streams.get(id);
    if (stream !== undefined && stream.tenant !== tenant) throw new EbbError('response_not_found', `no response ${id} is kept here`);
    if (stream !== undefined && stream.resumable) return stream;
    if ((stream !== undefined && stream.current !== 'handed_on') || this.expired.has(id))
      throw new EbbError('response_expired', `response ${id} can no longer be streamed: it ended more than the resume window ago, was abandoned, or was larger than the store keeps`);
    throw new EbbError('response_not_found', `no response ${id} is kept here`);
  }

  /** The live stream `id`, if this frontend runs it (a cancel asked anywhere stops it here). */
  running(id: string): KeptStream | undefined {
    const stream = this.streams.get(id);
    return stream?.current === 'live' && stream.lease?.current !== 'lost' ? stream : undefined;
  }

  /**
   * Follows kept stream `id` on `res` from `from`: here, or (a fleet) from the shared store when
   * another frontend runs it. Counts each resume once, by how it ended; throws its 404 or 503.
   */
  async resume(id: string, tenant: string, res: ServerResponse, from: ResumeFrom, headers: Record<string, string>, hijack: () => void): Promise<void> {
    try {
      let kept: KeptStream;
      try {
        kept = this.get(id, tenant);
      } catch (err) {
        if (this.shared === undefined || !(err instanceof EbbError) || err.code !== 'response_not_found') throw err;
        await this.shared.follow(id, tenant, res, from, headers, hijack);
        return this.metrics?.resume('resumed');
      }
      kept.follow(res, from, headers);
      hijack();
      this.metrics?.resume('resumed');
    } catch (err) {
      if (err instanceof EbbError && (err.code === 'response_expired' || err.code === 'response_not_found')) this.metrics?.resume(err.code === 'response_expired' ? 'expired' : 'not_found');
      throw err;
    }
  }

  /**
   * A stream that never started (its request failed before any byte): forgotten here, as if never
   * kept; its copy in the fleet's store says it stopped (`error`), so nobody takes it over.
   */
  discard(stream: KeptStream, error: string): void {
    void stream.lease?.finish(Buffer.from(error), 'x');
    if (this.streams.get(stream.id) !== stream) return;
    this.streams.delete(stream.id);
    this.ended.delete(stream);
    stream.drop();
  }

  /** A response its client deleted: no longer resumable here (a live stream is never removed: its generation owns it). */
  remove(id: string, tenant: string): void {
    const stream = this.streams.get(id);
    if (stream === undefined || stream.tenant !== tenant || stream.current === 'live') return;
    this.streams.delete(id);
    this.ended.delete(stream);
    stream.drop();
  }

  /** Every live stream this frontend runs and copies to the fleet's store (a shutdown hands them on). */
  liveShared(): KeptStream[] {
    return [...this.streams.values()].filter((s) => s.current === 'live' && s.lease !== undefined);
  }

  get size(): number {
    return this.streams.size;
  }

  watchResponses(records: { keptBytes: number; size: number }): void {
    this.metrics?.watchResponses(records);
  }

  get keptBytes(): number {
    return this.bytes;
  }

  /**
   * Stops every live generation (the frontend is closing): nothing runs on behind it. `reason` says
   * why (server_closing: those the fleet's store shares are handed on). Resolves once each has ended
   * (bounded: a stream whose end cannot be written is not waited for).
   */
  async cancelAll(reason: unknown, boundMs = 2_000): Promise<void> {
    const live = [...this.streams.values()].filter((s) => s.current === 'live');
    for (const s of live) s.cancel(reason);
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([Promise.all(live.map((s) => s.over)), new Promise((resolve) => (timer = setTimeout(resolve, boundMs)))]);
    clearTimeout(timer);
  }

  async close(): Promise<void> {
    clearTimeout(this.sweeper);
    await this.shared?.close();
  }

  private forget(stream: KeptStream, reason: 'window' | 'bytes' | 'count'): void {
    this.streams.delete(stream.id);
    this.ended.delete(stream);
    stream.drop();
    this.expired.add(stream.id);
    if (this.expired.size > EXPIRED_MEMORY) this.expired.delete(this.expired.values().next().value as string);
    this.metrics?.forgotten(reason);
  }

  /** Ended streams first, oldest first, while `over()` holds: a live one is never forgotten. */
  private forgetOldest(reason: 'bytes' | 'count', over: () => boolean): void {
    for (const s of this.ended) {
      if (!over()) return;
      this.forget(s, reason);
    }
  }

  private sweep(now = Date.now()): void {
    for (const s of this.ended) {
      if (now - s.endedAt < this.opts.windowMs) break;
      this.forget(s, 'window');
    }
  }

  /** The next ended stream's expiry, swept on a timer (and at every lookup). */
  private sweepLater(): void {
    if (this.sweeper !== undefined) return;
    const first = this.ended.values().next().value as KeptStream | undefined;
    if (first === undefined) return;
    this.sweeper = setTimeout(() => {
      this.sweeper = undefined;
      this.sweep();
      this.sweepLater();
    }, Math.max(0, first.endedAt + this.opts.windowMs - Date.now()) + 10).unref();
  }
}
