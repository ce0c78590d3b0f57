import type { ServerResponse } from 'node:http';
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { EbbError } from '../../protocol/errors.js';
import { KeptStream, type ResumeFrom } from './kept-stream.js';
import type { TakeoverPlan } from './takeover.js';
import { sseEvents } from '../../common/sse-events.js';
import type { ChatMessage } from '../../protocol/request-plane.js';

/** How long a live stream's owner mark lives unrefreshed: a frontend gone for longer owns nothing. */
const LEASE_MS = 5_000;
/**
 * A stream's events are copied in batches at most this old: one XADD per batch instead of one per
 * write (at a token per write, the command per token was most of the store's cost). Only followers
 * at other frontends see the delay; a takeover regenerates what a crash lost of a batch.
 */
const BATCH_MS = 10;
/** A remote follower's wait per read; between reads it checks that the stream's owner is still there. */
const BLOCK_MS = 2_000;

const streamKey = (id: string) => `ebb:stream:${id}`;
const ownerKey = (id: string) => `ebb:stream:${id}:owner`;
const planKey = (id: string) => `ebb:stream:${id}:plan`;
const CANCEL_CHANNEL = 'ebb:responses:cancel';
const responseKey = (id: string) => `ebb:response:${id}`;
/** A plan outlives its stream by this at most when nobody ends it (its frontend died and nobody took over). */
const PLAN_TTL_MS = 24 * 3_600_000;

/** Continues a stream whose frontend is gone, here (the frontend's relay): false when it cannot. */
export type Takeover = (id: string, plan: TakeoverPlan, events: Buffer) => Promise<boolean>;

export interface RedisMirrorOptions {
  url: string;
  /** This frontend, as its live streams' owner mark names it. */
  owner: string;
  /** How long an ended stream's events stay in Redis (the resume window). */
  windowMs: number;
  /** Bounds of a replica kept here while remote followers read it (as the store's own streams). */
  maxResponseBytes: number;
  writeTimeoutMs: number;
  log: Logger;
  /** The store's health on /metrics: told each time Redis goes away or comes back. */
  onHealth?: ((up: boolean) => void) | undefined;
}

/**
 * The stream store shared by a fleet of frontends (`--stream-store redis://host:port`): every event
 * a frontend keeps in memory is also appended to a Redis stream (one per response, XADD, expiring
 * a resume window after it ended), and a resume that reaches a frontend which does not hold the
 * stream reads it there: the events after the client's point, then each new one as the owning
 * frontend writes it (XREAD), then the end. An owner mark (a key with a lease, refreshed while the
 * stream runs) says whether the frontend generating it is still there; a stream whose owner is gone
 * is taken over by a frontend following it (takeOver), or ends for its followers with an error event
 * saying so when it cannot be continued.
 * When Redis cannot be reached, streams run on unkept there (a log line, a metric) and a resume that
 * needs it is a 503 stream_store_unavailable: nothing admitted waits on Redis.
 */
export class RedisMirror {
  private readonly redis: Redis;
  /** Streams this frontend runs, whose owner marks it refreshes. */
  private readonly live = new Set<string>();
  /** Streams this frontend follows for its clients, one Redis reader each, shared by them. */
  private readonly replicas = new Map<string, KeptStream>();
  private readonly leases: NodeJS.Timeout;
  private up = true;
  /** Set by the public API: how a stream whose frontend died is continued here. */
  takeover: Takeover | undefined;
  /** Set by the public API: a background response this frontend runs is to be cancelled (asked at another frontend). */
  cancelled: ((id: string) => void) | undefined;
  private subscriber: Redis | undefined;
  /** Events written since the last batch went to Redis, per stream. */
  private readonly pending = new Map<string, Buffer[]>();
  private batch: NodeJS.Timeout | undefined;

  constructor(private readonly opts: RedisMirrorOptions) {
    // Commands fail at once while Redis is away (no offline queue): a stream never waits on it.
    this.redis = new Redis(opts.url, { enableOfflineQueue: false, maxRetriesPerRequest: 0, enableAutoPipelining: true, lazyConnect: true });
    this.redis.on('error', () => this.health(false));
    this.redis.on('ready', () => this.health(true));
    this.leases = setInterval(() => this.renewLeases(), LEASE_MS / 3).unref();
  }

  /**
   * Connects before the frontend serves (bounded): its first streams are shared too. Redis not there
   * is no reason not to serve: it is logged, and the client keeps reconnecting.
   */
  async connect(boundMs: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const connected = this.redis.connect().then(
      () => true,
      () => false,
    );
    const ok = await Promise.race([connected, new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), boundMs)))]);
    clearTimeout(timer);
    if (!ok) this.health(false);
    // A cancel asked at another frontend reaches the one that runs the response at once.
    this.subscriber = this.redis.duplicate({ enableOfflineQueue: true });
    this.subscriber.on('error', () => undefined);
    this.subscriber.on('message', (_channel: string, id: string) => this.cancelled?.(id));
    this.subscriber.subscribe(CANCEL_CHANNEL).catch(() => undefined);
  }

  /** A stored Responses API response, finished: its object and its conversation, for any frontend of the fleet (GET, previous_response_id). */
  keepResponse(id: string, object: Record<string, unknown>, history: ChatMessage[], ttlMs: number): Promise<void> {
    return this.redis.set(responseKey(id), JSON.stringify({ object, history }), 'PX', ttlMs).then(
      () => undefined,
      () => this.health(false),
    );
  }

  /** A finished response another frontend stored, or undefined. */
  async keptResponse(id: string): Promise<{ object: Record<string, unknown>; history: ChatMessage[] } | undefined> {
    const raw = await this.read(() => this.redis.get(responseKey(id)));
    return raw === null ? undefined : (JSON.parse(raw) as { object: Record<string, unknown>; history: ChatMessage[] });
  }

  /** Asks the frontend running background response `id` to stop it; resolves once its stream ended (bounded). */
  async cancel(id: string): Promise<void> {
    await this.redis.publish(CANCEL_CHANNEL, id);
    const reader = this.redis.duplicate({ enableOfflineQueue: true });
    try {
      let last = '0';
      for (let waited = 0; waited < 10_000; waited += BLOCK_MS) {
        const got = await reader.xreadBuffer('BLOCK', BLOCK_MS, 'STREAMS', streamKey(id), last);
        for (const [, entries] of got ?? [])
          for (const [entryId, fields] of entries) {
            last = entryId.toString();
            if (isEnd(entryFields(fields))) return;
          }
      }
    } finally {
      reader.disconnect();
    }
  }

  /**
   * A Responses API response another frontend runs (or ran), read from its kept events: its final
   * object, or its object now (status, output so far); with its plan (input) for a next turn.
   * Undefined when the fleet keeps no such response.
   */
  async response(id: string): Promise<{ object: Record<string, unknown>; plan: TakeoverPlan | undefined; done: boolean } | undefined> {
    const [entries, plan] = await this.read(() => Promise.all([this.redis.xrangeBuffer(streamKey(id), '-', '+'), this.redis.get(planKey(id))]));
    if (entries.length === 0) return undefined;
    return { ...(await responseFromEvents(eventsOf(entries))), plan: plan === null ? undefined : (JSON.parse(plan) as TakeoverPlan) };
  }

  /**
   * Resolves once Redis has applied every command sent so far (a PING answered after them, on the
   * same connection): a background response is announced only once its owner mark is there, so a
   * client that asks another frontend for it at once finds it. Never rejects.
   */
  async applied(): Promise<void> {
    await this.redis.ping().catch(() => undefined);
  }

  /** A stream this frontend starts: owned here until it ends. */
  opened(id: string): void {
    this.live.add(id);
    this.redis.set(ownerKey(id), this.opts.owner, 'PX', LEASE_MS).catch(() => this.health(false));
  }

  /** How another frontend would continue the stream if this one went away (written before its events). */
  plan(id: string, plan: TakeoverPlan): void {
    this.redis.set(planKey(id), JSON.stringify(plan), 'PX', PLAN_TTL_MS).catch(() => this.health(false));
  }

  append(id: string, payload: Buffer): void {
    const waiting = this.pending.get(id);
    if (waiting !== undefined) waiting.push(payload);
    else this.pending.set(id, [payload]);
    this.batch ??= setTimeout(() => this.flush(), BATCH_MS);
  }

  /** Every stream's pending events, one entry each (kept in the order they were written). */
  private flush(): void {
    clearTimeout(this.batch);
    this.batch = undefined;
    for (const [id, payloads] of this.pending) this.flushOne(id, payloads);
    this.pending.clear();
  }

  private flushOne(id: string, payloads: Buffer[]): void {
    this.redis.xadd(streamKey(id), '*', 'e', payloads.length === 1 ? payloads[0]! : Buffer.concat(payloads)).catch(() => this.health(false));
  }

  /** A stream's events not yet sent, now: before what ends or lets go of it. */
  private flushPending(id: string): void {
    const waiting = this.pending.get(id);
    if (waiting === undefined) return;
    this.pending.delete(id);
    this.flushOne(id, waiting);
  }

  ended(id: string, payload: Buffer | undefined): void {
    this.live.delete(id);
    this.flushPending(id);
    const key = streamKey(id);
    // Plain commands, pipelined in order with the events before them (a MULTI could overtake them).
    const fail = () => this.health(false);
    (payload === undefined ? this.redis.xadd(key, '*', 'x', '') : this.redis.xadd(key, '*', 'e', payload, 'end', '1')).catch(fail);
    this.redis.pexpire(key, this.opts.windowMs).catch(fail);
    // Its plan stays as long as its events: a next turn (previous_response_id) at another frontend reads its input there.
    this.redis.pexpire(planKey(id), this.opts.windowMs).catch(fail);
    this.redis.del(ownerKey(id)).catch(fail);
  }

  /** Lets go of a live stream at once (a frontend going away hands it on): its owner mark is dropped, no end is written. */
  release(id: string): void {
    this.live.delete(id);
    this.flushPending(id);
    this.redis.del(ownerKey(id)).catch(() => this.health(false));
  }

  /**
   * Follows kept stream `id` from Redis on `res`, from the client's point. Throws the 404 when
   * Redis holds no such stream, the 503 when Redis cannot be reached.
   */
  async follow(id: string, res: ServerResponse, from: ResumeFrom, headers: Record<string, string>, hijack: () => void): Promise<void> {
    let replica = this.replicas.get(id);
    if (replica === undefined) {
      if (!this.up) throw new EbbError('stream_store_unavailable', `the stream store (Redis) cannot be reached: response ${id} can be resumed only at the frontend that runs it`);
      // Its owner mark is there from its start; its events come in batches (a fresh stream may have none yet).
      const [entries, running] = await this.read(() => Promise.all([this.redis.xrangeBuffer(streamKey(id), '-', '+'), this.redis.exists(ownerKey(id))]));
      if (entries.length === 0 && running === 0) throw new EbbError('response_not_found', `no response ${id} is kept in this fleet`);
      replica = this.replicas.get(id) ?? this.replicate(id, entries);
    }
    hijack();
    replica.follow(res, from, headers);
  }

  /** A local copy of a remote stream, fed from Redis for as long as it runs. */
  private replicate(id: string, entries: Array<[Buffer, Buffer[]]>): KeptStream {
    const replica = new KeptStream(id, { maxBytes: this.opts.maxResponseBytes, graceMs: 0, writeTimeoutMs: this.opts.writeTimeoutMs, onBytes: () => undefined, onOver: () => this.replicas.delete(id), onAbandoned: () => undefined });
    replica.detach();
    this.replicas.set(id, replica);
    // XREAD's "from the start" (XRANGE's '-' is not an id it takes).
    let last = '0';
    for (const [entryId, fields] of entries) {
      last = entryId.toString();
      if (this.feed(replica, fields)) return replica;
    }
    void this.tail(id, replica, last);
    return replica;
  }

  /** One entry into the replica; true once it was the stream's end. */
  private feed(replica: KeptStream, fields: Buffer[]): boolean {
    const f = entryFields(fields);
    const payload = f.get('e');
    if (isEnd(f)) {
      replica.end(payload ?? Buffer.alloc(0));
      return true;
    }
    if (payload !== undefined) replica.append(payload);
    return false;
  }

  /** New entries as the owner writes them, until the end, or until the owner is gone. */
  private async tail(id: string, replica: KeptStream, after: string): Promise<void> {
    const reader = this.redis.duplicate({ enableOfflineQueue: true });
    let last = after;
    try {
      // Handed on (or its frontend long gone): nobody runs it now; continue it here at once.
      if ((await reader.exists(ownerKey(id))) === 0 && !(await this.takeOver(id))) {
        replica.end(Buffer.from(gone(id)));
        return;
      }
      for (;;) {
        const got = await reader.xreadBuffer('BLOCK', BLOCK_MS, 'STREAMS', streamKey(id), last);
        for (const [, entries] of got ?? []) {
          for (const [entryId, fields] of entries) {
            last = entryId.toString();
            if (this.feed(replica, fields)) return;
          }
        }
        // Nothing new, and nobody runs it: continue it here, or say it is gone.
        if (got === null && (await reader.exists(ownerKey(id))) === 0 && !(await this.takeOver(id))) {
          replica.end(Buffer.from(gone(id)));
          return;
        }
      }
    } catch (err) {
      this.opts.log.warn({ event: 'stream_store_follow_failed', response_id: id, err: (err as Error).message }, `following ${id} in the stream store failed: ${(err as Error).message}`);
      replica.end(Buffer.from(gone(id)));
    } finally {
      reader.disconnect();
    }
  }

  /**
   * A stream whose frontend is gone: this frontend takes its owner mark (one frontend wins) and
   * continues its generation from the events kept, written to the same Redis stream (its followers
   * everywhere read on). True when it is continued (here, or by the frontend that won the mark).
   */
  private async takeOver(id: string): Promise<boolean> {
    const raw = await this.redis.get(planKey(id));
    if (raw === null || this.takeover === undefined) return false;
    if ((await this.redis.set(ownerKey(id), this.opts.owner, 'PX', LEASE_MS, 'NX')) !== 'OK') return true;
    const events = eventsOf(await this.redis.xrangeBuffer(streamKey(id), '-', '+'));
    const started = await this.takeover(id, JSON.parse(raw) as TakeoverPlan, events);
    if (started) this.opts.log.info({ event: 'stream_taken_over', response_id: id }, `continuing stream ${id} here: the frontend that ran it is gone`);
    else await this.redis.del(ownerKey(id));
    return started;
  }

  /** A read a resume needs: Redis away is the 503 that says so (and the store's health goes down). */
  private async read<T>(op: () => Promise<T>): Promise<T> {
    try {
      return await op();
    } catch (err) {
      this.health(false);
      throw new EbbError('stream_store_unavailable', `the stream store (Redis) cannot be reached: ${(err as Error).message}`);
    }
  }

  private renewLeases(): void {
    if (this.live.size === 0 || !this.up) return;
    for (const id of this.live) this.redis.set(ownerKey(id), this.opts.owner, 'PX', LEASE_MS).catch(() => this.health(false));
  }

  private health(up: boolean): void {
    if (up === this.up) return;
    this.up = up;
    this.opts.onHealth?.(up);
    if (up) this.opts.log.info({ event: 'stream_store_available', url: this.opts.url }, 'the stream store (Redis) is back: new streams are shared again');
    else this.opts.log.warn({ event: 'stream_store_unavailable', url: this.opts.url }, 'the stream store (Redis) cannot be reached: streams run on, resumable only at the frontend that runs them');
  }

  async close(): Promise<void> {
    clearInterval(this.leases);
    this.flush();
    this.subscriber?.disconnect();
    for (const r of this.replicas.values()) r.cancel(new Error('the frontend is closing'));
    // What is still pipelined (a hand-on's released marks, the last events) reaches Redis first; bounded.
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.redis.quit().catch(() => undefined), new Promise((resolve) => (timer = setTimeout(resolve, 1_000)))]);
    clearTimeout(timer);
    this.redis.disconnect();
  }
}

/** A Redis stream entry's fields: `e` (events), and `end` or `x` on the last one (ended, or stopped without an end). */
function entryFields(fields: Buffer[]): Map<string, Buffer> {
  const f = new Map<string, Buffer>();
  for (let i = 0; i + 1 < fields.length; i += 2) f.set(fields[i]!.toString(), fields[i + 1]!);
  return f;
}

const isEnd = (f: Map<string, Buffer>) => f.has('end') || f.has('x');

/** Every event a stream's entries hold, in order, as one buffer. */
function eventsOf(entries: Array<[Buffer, Buffer[]]>): Buffer {
  return Buffer.concat(entries.flatMap(([, fields]) => entryFields(fields).get('e') ?? []));
}

/** The last event of a stream whose frontend is gone: an error saying so, in the stream's own format. */
function gone(id: string): string {
  const message = `the frontend that ran response ${id} is gone; it cannot be continued (retry the request)`;
  if (id.startsWith('resp_')) return `event: error\ndata: ${JSON.stringify({ type: 'error', code: 'server_closing', message, param: null })}\n\n`;
  return `data: ${JSON.stringify({ error: { message, type: 'server_error', param: null, code: 'server_closing' } })}\n\n`;
}

/** A Responses API stream's events, read back into its object: the last one it carried, its output so far. */
async function responseFromEvents(events: Buffer): Promise<{ object: Record<string, unknown>; done: boolean }> {
  let object: Record<string, unknown> = {};
  let item: Record<string, unknown> | undefined;
  let text = '';
  for await (const { data } of sseEvents([events])) {
    const parsed = JSON.parse(data) as { type?: string; response?: Record<string, unknown>; item?: Record<string, unknown>; delta?: string; code?: string };
    if (parsed.response !== undefined) object = parsed.response;
    if (parsed.type === 'response.output_item.added' && parsed.item !== undefined) item = parsed.item;
    if (parsed.type === 'response.output_text.delta' && typeof parsed.delta === 'string') text += parsed.delta;
    if (parsed.type === 'response.completed' || parsed.type === 'response.incomplete' || parsed.type === 'response.failed') return { object, done: true };
    if (parsed.type === 'error') return { object: { ...object, status: parsed.code === 'cancelled' ? 'cancelled' : 'failed' }, done: true };
  }
  const output = item === undefined ? [] : [{ ...item, content: text === '' ? [] : [{ type: 'output_text', text, annotations: [], logprobs: [] }] }];
  return { object: { ...object, status: 'in_progress', output }, done: false };
}
