import { EbbError } from '../../protocol/errors.js';
import type { ServerResponse } from 'node:http';
import { KeptStream, type ResumeFrom } from './kept-stream.js';
import type { RedisMirror } from './redis-mirror.js';

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
  /** redis://host:port: a store shared by a fleet of frontends (see RedisMirror); undefined: this process's memory alone. */
  redisUrl?: string | undefined;
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

  constructor(
    readonly opts: StreamStoreOptions,
    private readonly metrics?: StreamStoreMetrics,
    /** A fleet's shared store: every kept stream is copied there, and resumes of streams kept elsewhere read it. */
    readonly mirror?: RedisMirror | undefined,
  ) {
    metrics?.watch(this);
  }

  /** A new stream to keep, under `id` (a response id: chatcmpl-, cmpl-, resp_). */
  open(id: string): KeptStream {
    const stream = new KeptStream(id, {
      maxBytes: this.opts.maxResponseBytes,
      graceMs: this.opts.graceMs,
      writeTimeoutMs: this.opts.writeTimeoutMs,
      onBytes: (delta) => {
        this.bytes += delta;
        if (delta > 0 && this.bytes > this.opts.maxTotalBytes) this.forgetOldest('bytes', () => this.bytes > this.opts.maxTotalBytes);
      },
      onOver: (s) => {
        this.ended.add(s);
        this.sweepLater();
      },
      onAbandoned: (events) => this.metrics?.abandoned(id, events),
      mirror: this.mirror,
    });
    this.mirror?.opened(id);
    this.streams.set(id, stream);
    if (this.streams.size > this.opts.maxStreams) this.forgetOldest('count', () => this.streams.size > this.opts.maxStreams);
    return stream;
  }

  /** The kept stream `id`, or the 404 saying why there is none. */
  get(id: string): KeptStream {
    this.sweep();
    const stream = this.streams.get(id);
    if (stream !== undefined && stream.resumable) return stream;
    if (stream !== undefined || this.expired.has(id))
      throw new EbbError('response_expired', `response ${id} can no longer be streamed: it ended more than the resume window ago, was abandoned, or was larger than the store keeps`);
    throw new EbbError('response_not_found', `no response ${id} is kept here`);
  }

  /**
   * Follows kept stream `id` on `res` from `from`: here, or (a fleet) from the shared store when
   * another frontend runs it. Counts each resume once, by how it ended; throws its 404 or 503.
   */
  async resume(id: string, res: ServerResponse, from: ResumeFrom, headers: Record<string, string>, hijack: () => void): Promise<void> {
    try {
      let kept: KeptStream;
      try {
        kept = this.get(id);
      } catch (err) {
        if (this.mirror === undefined || !(err instanceof EbbError) || err.code !== 'response_not_found') throw err;
        await this.mirror.follow(id, res, from, headers, hijack);
        return this.metrics?.resume('resumed');
      }
      hijack();
      kept.follow(res, from, headers);
      this.metrics?.resume('resumed');
    } catch (err) {
      if (err instanceof EbbError && (err.code === 'response_expired' || err.code === 'response_not_found')) this.metrics?.resume(err.code === 'response_expired' ? 'expired' : 'not_found');
      throw err;
    }
  }

  /**
   * A stream taken over from a frontend that went away: kept here from now on, its earlier events
   * (`seed`, as the store had them) first; it runs to its end with nobody following, as a background one.
   */
  adopt(id: string, seed: Buffer): KeptStream {
    const stream = this.open(id);
    stream.seed(seed);
    stream.detach();
    return stream;
  }

  /** A stream that never started (its request failed before any byte): forgotten, as if never kept. */
  discard(stream: KeptStream): void {
    if (this.streams.get(stream.id) !== stream) return;
    this.streams.delete(stream.id);
    this.ended.delete(stream);
    stream.drop();
  }

  get size(): number {
    return this.streams.size;
  }

  get keptBytes(): number {
    return this.bytes;
  }

  /** Cancels every live generation (the frontend is closing): nothing runs on behind it. */
  cancelAll(reason: unknown): void {
    for (const s of this.streams.values()) if (s.state === 'live') s.cancel(reason);
  }

  async close(): Promise<void> {
    clearTimeout(this.sweeper);
    await this.mirror?.close();
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
