import type { ServerResponse } from 'node:http';
import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import { EbbError } from '../../protocol/errors.js';
import type { Resumed } from '../relay/lane.js';
import { KeptStream, maxEventId, type ResumeFrom } from './kept-stream.js';
import { RedisStore, type RedisClient } from './redis-store.js';
import { APPEND, APPEND_MANY, CANCEL_CHANNEL, FINISH, HANDED_ON_CHANNEL, OPEN, parseEntry, RELEASE, RENEW, REWRITE, storedKey, streamKeys, TAKE, type StepAnswer } from './shared-protocol.js';
import { BATCH_MS, StreamLease, type LeaseBounds, type Opening, type SharedSteps } from './stream-lease.js';
import { progressOf } from './stream-progress.js';

/** How long a live stream's lease lives unrenewed: a frontend gone (or paused) for longer holds nothing. */
export const LEASE_MS = 5_000;
/**
 * A remote follower's wait per read: a stream that brings nothing for this long has its writer
 * checked (gone: taken over here), so a frontend killed mid-stream is replaced well within a second.
 */
const BLOCK_MS = 300;
/** How long a follower's frontend says it follows (refreshed each second while a client follows there). */
const FOLLOWED_MS = 3_000;
/** A replica nobody here has followed for this long is let go (a later resume makes another). */
const IDLE_REPLICA_MS = 2_000;
/** How long a follower reads on through a store that does not answer (a restart, a failover) before it gives up, saying so. */
const FOLLOW_OUTAGE_MS = 15_000;
/** Entries per read of a copy (XRANGE pages: a copy is read in bounded steps). */
const PAGE = 256;

/** How a stream is continued from its copy here (the public API sets it: it knows the stream's format). */
export type Takeover = (taken: TakenStream, opts: { cancel?: boolean }) => Promise<boolean>;

/** A stream this frontend just took over: its lease, how it was planned, and its copy. */
export interface TakenStream {
  id: string;
  lease: StreamLease;
  plan: string;
  tenant: string;
  copy: StreamCopy;
  /** Each sequence as the copy has it (its raw text, tokens, finish). */
  resumed: Resumed[];
}

/** A stream's copy as read from the store. */
export interface StreamCopy {
  events: Buffer;
  /** The highest event id in it (-1: none): a continuation numbers on from the next. */
  maxId: number;
  /** Each batch's progress since the copy's start (or its last rewrite). */
  deltas: string[];
  /** The number the next batch will have. */
  nextBatch: number;
  /** The last entry read (XREAD's cursor). */
  cursor: string;
  /** How the copy ends, when it does: its last events are in `events`. */
  last: 'ended' | 'stopped' | undefined;
  handedOn: boolean;
  overflow: boolean;
  /** A batch is missing: the copy is not whole (never served). */
  gap: boolean;
}

export interface SharedStreamsOptions {
  /** This frontend, as its tokens name it. */
  owner: string;
  /** How long an ended stream's copy stays (the resume window). */
  windowMs: number;
  /** One copy's bound, as the memory store's (past it, no longer copied, and so no longer resumable elsewhere). */
  maxResponseBytes: number;
  writeTimeoutMs: number;
  log: Logger;
  /** Told of each stream this frontend took over (counted on /metrics). */
  onTakeover?: (() => void) | undefined;
}

type Keys = ReturnType<typeof streamKeys>;
type Arg = string | number | Buffer;

/** Streams' batches in one APPEND_MANY at most (Redis runs nothing else while a script runs). */
const APPEND_MANY_MAX = 64;

/** One stream's batch: sent alone, or in its flush's one script with the other streams' (APPEND_MANY). */
interface Collected {
  keys: [string, string, string];
  args: Arg[];
  resolve: (answer: StepAnswer) => void;
  reject: (err: unknown) => void;
}
type Scripted = RedisClient & {
  ebbOpen(...a: Array<string | number | Buffer>): Promise<StepAnswer>;
  ebbAppend(...a: Array<string | number | Buffer>): Promise<StepAnswer>;
  ebbAppendMany(...a: Array<string | number | Buffer>): Promise<StepAnswer[]>;
  ebbRewrite(...a: Array<string | number | Buffer>): Promise<StepAnswer>;
  ebbRenew(...a: Array<string | number | Buffer>): Promise<StepAnswer>;
  ebbFinish(...a: Array<string | number | Buffer>): Promise<StepAnswer>;
  ebbRelease(...a: Array<string | number | Buffer>): Promise<StepAnswer>;
  ebbTake(...a: Array<string | number | Buffer>): Promise<[string, string?, string?, string?]>;
};

/**
 * The streams a fleet of frontends shares (`--stream-store redis://...`): the one owner of a shared
 * stream's whole Redis protocol (shared-protocol.ts). A frontend opening a stream holds its lease
 * (the only writer of its copy); a resume that reaches a frontend which does not run the stream
 * follows the copy (its own local replica, shared by its clients there); a stream whose writer is
 * gone (crashed, paused past its lease, or handed on at its shutdown) is taken over by one of the
 * frontends following it, fenced: its old writer, if it wakes, writes nothing more. When Redis
 * cannot be reached, streams run on unshared (nothing admitted waits on Redis) and a resume that
 * needs it is a 503.
 */
export class SharedStreams implements SharedSteps {
  private readonly redis: Scripted;
  private readonly held = new Set<StreamLease>();
  private readonly toFlush = new Set<StreamLease>();
  private readonly toFlushNow = new Set<StreamLease>();
  private batchTimer: NodeJS.Timeout | undefined;
  private batchSoon: NodeJS.Immediate | undefined;
  /** While a flush runs (not on a Cluster): its streams' batches, sent together as it ends. */
  private collected: Collected[] | undefined;
  private readonly renewals: NodeJS.Timeout;
  /** Streams this frontend follows for its clients, one reader each, shared by them. */
  private readonly replicas = new Map<string, KeptStream>();
  private readonly bounds: LeaseBounds;
  /** Set by the public API: how a stream whose writer is gone is continued here. */
  takeover: Takeover | undefined;
  /** Set by the public API: a stream this frontend runs is to be cancelled (asked at another frontend). */
  cancelled: ((id: string) => void) | undefined;
  private closing = false;

  constructor(
    readonly store: RedisStore,
    private readonly opts: SharedStreamsOptions,
  ) {
    const r = store.client;
    const define = (name: string, keys: number, lua: string) => r.defineCommand(name, { numberOfKeys: keys, lua });
    define('ebbOpen', 2, OPEN);
    define('ebbAppend', 3, APPEND);
    r.defineCommand('ebbAppendMany', { lua: APPEND_MANY });
    define('ebbRewrite', 3, REWRITE);
    define('ebbRenew', 3, RENEW);
    define('ebbFinish', 3, FINISH);
    define('ebbRelease', 3, RELEASE);
    define('ebbTake', 3, TAKE);
    this.redis = r as Scripted;
    this.bounds = { leaseMs: LEASE_MS, liveTtlMs: Math.max(opts.windowMs, 10 * LEASE_MS), windowMs: opts.windowMs, maxBytes: opts.maxResponseBytes };
    this.renewals = setInterval(() => {
      for (const lease of this.held) lease.renew();
    }, LEASE_MS / 3).unref();
  }

  /** Hears the fleet's notices: cancels asked elsewhere, streams handed on by a frontend going away. */
  listen(): void {
    this.store.listen(CANCEL_CHANNEL, (id) => this.cancelled?.(id));
    this.store.listen(HANDED_ON_CHANNEL, (id) => {
      if (!this.closing) void this.ensureRunning(id);
    });
  }

  get healthy(): boolean {
    return this.store.healthy;
  }

  get healthySince(): number {
    return this.store.healthySince;
  }

  /**
   * A new stream, held here: its copy is written as it runs. The store has it from its first batch
   * (that step opens it: one script where there were two); the lease's `opened` says when.
   */
  open(id: string, plan: string, tenant: string): StreamLease {
    return this.track(new StreamLease(id, this.token(), this, this.bounds, plan, tenant, this.opts.log));
  }

  // --- SharedSteps: the lease's atomic steps ---

  schedule(lease: StreamLease, now = false): void {
    // Now: at the end of this turn, so what the same turn wrote goes in one batch.
    if (now) {
      this.toFlushNow.add(lease);
      this.batchSoon ??= setImmediate(() => this.flushNow());
    } else {
      this.toFlush.add(lease);
      this.batchTimer ??= setTimeout(() => this.flushAll(), BATCH_MS);
    }
  }

  openEmpty(k: Keys, token: string, b: LeaseBounds, o: Opening): Promise<StepAnswer> {
    return this.redis.ebbOpen(k.meta, k.lease, token, b.leaseMs, b.liveTtlMs, o.plan, o.tenant);
  }

  append(k: Keys, token: string, b: LeaseBounds, batch: number, events: Buffer, progress: string, o?: Opening): Promise<StepAnswer> {
    return new Promise((resolve, reject) => {
      const c: Collected = { keys: [k.meta, k.lease, k.events], args: [token, b.leaseMs, b.liveTtlMs, batch, b.maxBytes, events, progress, o?.plan ?? '', o?.tenant ?? ''], resolve, reject };
      if (this.collected !== undefined) this.collected.push(c);
      else this.sendTogether([c]);
    });
  }

  renew(k: Keys, token: string, b: LeaseBounds): Promise<StepAnswer> {
    return this.redis.ebbRenew(k.meta, k.lease, k.events, token, b.leaseMs, b.liveTtlMs);
  }

  finish(k: Keys, token: string, b: LeaseBounds, batch: number, kind: 'end' | 'x', events: Buffer, progress: string, o?: Opening): Promise<StepAnswer> {
    return this.redis.ebbFinish(k.meta, k.lease, k.events, token, b.windowMs, batch, kind, events, progress, ...(o === undefined ? [] : [o.plan, o.tenant]));
  }

  release(k: Keys, token: string): Promise<StepAnswer> {
    return this.redis.ebbRelease(k.meta, k.lease, k.events, token);
  }

  rewrite(k: Keys, token: string, b: LeaseBounds, plan: string, tenant: string, events: Buffer, progress: string, last: '' | 'end' | 'x'): Promise<StepAnswer> {
    const ttl = last === '' ? b.liveTtlMs : b.windowMs;
    return this.redis.ebbRewrite(k.meta, k.lease, k.events, token, b.leaseMs, ttl, b.maxBytes, plan, tenant, events, progress, last);
  }

  async followed(k: Keys): Promise<boolean> {
    return (await this.redis.exists(k.followed)) === 1;
  }

  // --- reading and following copies ---

  /** The stream's state and tenant, or undefined when the fleet keeps no such stream. */
  private async meta(id: string): Promise<{ state: string; tenant: string; plan: string } | undefined> {
    const [state, tenant, plan] = await this.read(() => this.redis.hmget(streamKeys(id).meta, 'state', 'tenant', 'plan'));
    return state === null || state === undefined ? undefined : { state, tenant: tenant ?? '', plan: plan ?? '' };
  }

  /** The copy of stream `id`, read in bounded pages (never more than one copy's bound). */
  async copy(id: string): Promise<StreamCopy> {
    const events: Buffer[] = [];
    const copy: StreamCopy = { events: Buffer.alloc(0), maxId: -1, deltas: [], nextBatch: 0, cursor: '0', last: undefined, handedOn: false, overflow: false, gap: false };
    let bytes = 0;
    for (let start = '-'; ; ) {
      const page = await this.read(() => this.redis.xrangeBuffer(streamKeys(id).events, start, '+', 'COUNT', PAGE));
      for (const [entryId, fields] of page) {
        copy.cursor = entryId.toString();
        const e = parseEntry(fields);
        if (e.rewrite) {
          events.length = 0;
          copy.deltas = [];
          bytes = 0;
          copy.nextBatch = 0;
          copy.gap = false;
        }
        if (e.marker === 'handed_on') copy.handedOn = true;
        if (e.marker === 'overflow') copy.overflow = true;
        if (e.batch === undefined) continue;
        if (e.batch !== copy.nextBatch) copy.gap = true;
        copy.nextBatch = e.batch + 1;
        if (e.events !== undefined) {
          events.push(e.events);
          bytes += e.events.length;
        }
        copy.deltas.push(e.progress ?? '');
        if (e.last !== undefined) copy.last = e.last;
        copy.handedOn = false;
      }
      if (bytes > this.opts.maxResponseBytes) copy.overflow = true;
      if (page.length < PAGE || copy.overflow) break;
      start = `(${copy.cursor}`;
    }
    copy.events = Buffer.concat(events);
    copy.maxId = maxEventId(copy.events);
    return copy;
  }

  /**
   * Follows stream `id` from the shared store on `res`, from the client's point: its copy, then
   * each batch as its writer copies it, then its end. Throws the 404 when the fleet keeps no such
   * stream for this tenant (or its copy is not whole), the 503 when Redis cannot be reached.
   */
  async follow(id: string, tenant: string, res: ServerResponse, from: ResumeFrom, headers: Record<string, string>, hijack: () => void): Promise<void> {
    let replica = this.replicas.get(id);
    if (replica === undefined || replica.tenant !== tenant) {
      if (!this.store.healthy) throw new EbbError('stream_store_unavailable', `the stream store (Redis) cannot be reached: response ${id} can be resumed only at the frontend that runs it`);
      const meta = await this.meta(id);
      if (meta === undefined || meta.tenant !== tenant) throw new EbbError('response_not_found', `no response ${id} is kept in this fleet`);
      const copy = await this.copy(id);
      if (copy.overflow || meta.state === 'overflow') throw new EbbError('response_expired', `response ${id} can no longer be streamed: it was larger than the store keeps`);
      if (copy.gap) throw new EbbError('stream_copy_incomplete', `the fleet's copy of response ${id} is missing events (the store lost some); retry shortly: its frontend rewrites it whole`);
      replica = this.replicas.get(id) ?? this.replicate(id, tenant, copy);
    }
    replica.follow(res, from, headers);
    hijack();
  }

  /** A local copy of a stream another frontend runs, fed from Redis while it runs and somebody here follows it. */
  private replicate(id: string, tenant: string, copy: StreamCopy): KeptStream {
    const replica = new KeptStream(id, { maxBytes: this.opts.maxResponseBytes, graceMs: 0, writeTimeoutMs: this.opts.writeTimeoutMs, onBytes: () => undefined, onOver: () => this.replicas.delete(id), onAbandoned: () => undefined }, tenant);
    replica.detach();
    replica.seed(copy.events);
    if (copy.last === 'ended') void replica.end(Buffer.alloc(0));
    else if (copy.last === 'stopped') replica.stop(Buffer.alloc(0));
    else {
      this.replicas.set(id, replica);
      void this.tail(id, replica, copy);
    }
    return replica;
  }

  /** New batches as the writer copies them, until the end; a writer gone is replaced here (or by whoever wins). */
  private async tail(id: string, replica: KeptStream, copy: StreamCopy): Promise<void> {
    const reader = this.store.reader(BLOCK_MS);
    const k = streamKeys(id);
    let cursor = copy.cursor;
    let expected = copy.nextBatch;
    let followedAt = performance.now();
    // Whether the writer may be gone: checked first, then whenever a read waited its whole block or a hand-on came.
    let check = true;
    let handedOn = copy.handedOn;
    /** Since when reads fail, or the copy is missing (Redis away, restarted): followed on for a while, as its writer mends the copy. */
    let failingSince: number | undefined;
    let missingSince: number | undefined;
    let beatAt = 0;
    const stop = (message: string) => replica.stop(Buffer.from(gone(id, message)));
    try {
      for (;;) {
        if (replica.current !== 'live') return;
        try {
          // Its writer, wherever it is, keeps the stream going while clients follow it here (it looks before abandoning it).
          const now = performance.now();
          if (replica.followerCount > 0) {
            followedAt = now;
            if (now - beatAt > FOLLOWED_MS / 3) {
              beatAt = now;
              reader.set(k.followed, '1', 'PX', FOLLOWED_MS).catch(() => undefined);
            }
          }
          // Nobody here follows it any more: this copy is let go; a later resume makes another.
          if (now - followedAt > IDLE_REPLICA_MS) return replica.stop(Buffer.alloc(0));
          if (check) {
            const gone = handedOn ? '' : await this.writerGone(reader, id);
            if (gone !== undefined) {
              // No writer: take it over here (or another frontend does). An end already copied is read next.
              // Clients ahead of its copy (their frontend died while the store was away) cannot be continued exactly.
              const answer = await this.takeOver(id, { gone, taken: (copy) => replica.regenerates(copy.events, Buffer.from(this.ahead(id))) });
              if (answer === 'overflow') return stop('its copy was larger than the store keeps');
              // No copy at all: expired, or the store restarted empty and its writer is about to rewrite it.
              if (answer === 'none') {
                missingSince ??= Date.now();
                if (Date.now() - missingSince > FOLLOW_OUTAGE_MS) return stop('its copy expired');
              } else missingSince = undefined;
              handedOn = false;
            }
            check = false;
          }
          const got = await reader.xreadBuffer('BLOCK', BLOCK_MS, 'STREAMS', k.events, cursor);
          failingSince = undefined;
          if (got === null) check = true;
          for (const [, entries] of got ?? []) {
            for (const [entryId, fields] of entries) {
              cursor = entryId.toString();
              const e = parseEntry(fields);
              if (e.rewrite) {
                // The whole copy again (its writer mended a loss): what this replica lacks of it, if it is the same stream.
                const have = replica.whole();
                if (e.events === undefined || e.events.length < have.length || e.events.compare(have, 0, have.length, 0, have.length) !== 0) return stop('its copy changed under this frontend');
                expected = 0;
                e.events = e.events.subarray(have.length);
              }
              if (e.marker === 'handed_on') handedOn = check = true;
              if (e.marker === 'overflow') return stop('its copy grew larger than the store keeps');
              if (e.batch === undefined) continue;
              if (e.batch !== expected) return stop('its copy is missing events');
              expected = e.batch + 1;
              if (e.last === 'ended') return void replica.end(e.events ?? Buffer.alloc(0));
              if (e.last === 'stopped') return replica.stop(e.events ?? Buffer.from(gone(id, 'it was stopped')));
              if (e.events !== undefined && e.events.length > 0) replica.append(e.events);
            }
          }
        } catch (err) {
          if (this.closing) return replica.stop(Buffer.from(gone(id, 'this frontend is closing')));
          // Redis away (restarting, failing over): read on once it answers; its writer rewrites what it lost.
          failingSince ??= Date.now();
          if (Date.now() - failingSince > FOLLOW_OUTAGE_MS) {
            this.opts.log.warn({ event: 'stream_store_follow_failed', response_id: id, err: (err as Error).message }, `following ${id} in the stream store failed: ${(err as Error).message}`);
            return stop(`the stream store could not be read for ${FOLLOW_OUTAGE_MS / 1000} s: ${(err as Error).message}`);
          }
          check = true;
          await new Promise((resolve) => setTimeout(resolve, 250));
        }
      }
    } finally {
      this.replicas.delete(id);
      reader.disconnect();
    }
  }

  /**
   * A stream whose writer is gone: this frontend takes its lease (one frontend wins) and continues
   * it from its copy. 'taken' here, 'held' when another frontend holds it now; 'none' when the
   * fleet keeps no such stream, else its state (ended, stopped, overflow).
   */
  private async takeOver(id: string, opts: { cancel?: boolean; gone?: string; taken?: (copy: StreamCopy) => void } = {}): Promise<string> {
    if (this.takeover === undefined || this.closing) return 'held';
    const k = streamKeys(id);
    const token = this.token();
    const [answer, next, plan, tenant] = await this.redis.ebbTake(k.meta, k.lease, k.events, token, LEASE_MS, this.bounds.liveTtlMs, opts.gone ?? '');
    if (answer !== 'taken') return answer;
    const copy = await this.copy(id);
    const lanes = plan === undefined ? 1 : Math.max(1, (JSON.parse(plan) as { gens?: unknown[] }).gens?.length ?? 1);
    const resumed = progressOf(copy.deltas, lanes);
    const lease = this.track(new StreamLease(id, token, this, this.bounds, plan ?? '', tenant ?? '', this.opts.log, { batch: Number(next), resumed, bytes: copy.events.length }));
    if (copy.gap || copy.overflow) {
      // A copy that is not whole cannot be continued: it ends, saying so, for everyone following it.
      await lease.finish(Buffer.from(gone(id, 'its copy is missing events')), 'x');
      return 'stopped';
    }
    const started = await this.takeover({ id, lease, plan: plan ?? '', tenant: tenant ?? '', copy, resumed }, opts).catch((err: unknown) => {
      this.opts.log.warn({ event: 'takeover_failed', response_id: id, err: (err as Error).message }, `continuing ${id} here failed: ${(err as Error).message}`);
      return false;
    });
    if (!started) {
      await lease.finish(Buffer.from(gone(id, 'it could not be continued')), 'x');
      return 'stopped';
    }
    opts.taken?.(copy);
    this.opts.onTakeover?.();
    this.opts.log.info({ event: 'stream_taken_over', response_id: id, events_kept: copy.maxId + 1 }, `continuing stream ${id} here: the frontend that ran it is gone`);
    return 'taken';
  }

  private ahead(id: string): string {
    return gone(id, "the client has events its copy lacks (its frontend went away while the stream store could not take them): a continuation would not match what it has");
  }

  /**
   * Whether stream `id`'s writer is gone: '' when nobody holds its lease, the lease's token when its
   * holder's frontend has no connection to the store any more (killed, crashed: gone long before its
   * lease runs out), undefined while a writer holds it (or that cannot be told).
   */
  private async writerGone(r: RedisClient, id: string): Promise<string | undefined> {
    const holder = await r.get(streamKeys(id).lease);
    if (holder === null) return '';
    const owner = holder.slice(0, holder.lastIndexOf(':'));
    return (await this.store.connected(owner)) === false ? holder : undefined;
  }

  /**
   * A stream nobody may be following (a background response polled with GET): if its writer is
   * gone, continue it here now. Resolves once decided; never rejects.
   */
  async ensureRunning(id: string): Promise<void> {
    try {
      const gone = await this.writerGone(this.redis, id);
      if (gone !== undefined) await this.takeOver(id, { gone });
    } catch {
      // Redis away: whoever asks next tries again.
    }
  }

  /**
   * Asks the frontend running stream `id` to cancel it; when no frontend runs it (its writer is
   * gone), it is taken over here and stopped at once. Resolves once its copy ended (bounded).
   */
  async cancel(id: string): Promise<void> {
    await this.read(() => this.store.publish(CANCEL_CHANNEL, id));
    const reader = this.store.reader(BLOCK_MS);
    try {
      let cursor = (await this.copy(id)).cursor;
      for (const until = performance.now() + 10_000; performance.now() < until; ) {
        const got = await reader.xreadBuffer('BLOCK', BLOCK_MS, 'STREAMS', streamKeys(id).events, cursor);
        for (const [, entries] of got ?? [])
          for (const [entryId, fields] of entries) {
            cursor = entryId.toString();
            if (parseEntry(fields).last !== undefined) return;
          }
        if ((await this.copy(id)).last !== undefined) return;
        const gone = await this.writerGone(reader, id);
        if (gone !== undefined) {
          const answer = await this.takeOver(id, { cancel: true, gone });
          if (answer !== 'held') return;
        }
      }
    } finally {
      reader.disconnect();
    }
  }

  /** A finished response kept for retrieval by any frontend of the fleet (GET, previous_response_id), with its tenant. */
  keep(id: string, value: { tenant: string; [k: string]: unknown }, ttlMs: number): Promise<void> {
    return this.redis.set(storedKey(id), JSON.stringify(value), 'PX', ttlMs).then(
      () => undefined,
      () => undefined,
    );
  }

  /** A response its client deleted (one that is over): its stored object and its stream's copy, gone from the fleet's store. */
  async forget(id: string): Promise<void> {
    const k = streamKeys(id);
    await this.read(() => this.redis.del(storedKey(id), k.meta, k.events, k.followed));
  }

  /** A finished response another frontend kept, or undefined (another tenant's is none). */
  async kept<T extends { tenant: string }>(id: string, tenant: string): Promise<T | undefined> {
    const raw = await this.read(() => this.redis.get(storedKey(id)));
    if (raw === null) return undefined;
    const value = JSON.parse(raw) as T;
    return value.tenant === tenant ? value : undefined;
  }

  /** A stream's plan and copy (for the Responses API's GET at a frontend that does not run it), or undefined (none for this tenant). */
  async planAndCopy(id: string, tenant: string): Promise<{ plan: string; copy: StreamCopy; running: boolean } | undefined> {
    const meta = await this.meta(id);
    if (meta === undefined || meta.tenant !== tenant) return undefined;
    const [copy, lease] = await Promise.all([this.copy(id), this.read(() => this.redis.exists(streamKeys(id).lease))]);
    return { plan: meta.plan, copy, running: lease === 1 };
  }

  /** A stream handed on by this frontend, announced so that another frontend continues it now (a background response has nobody to resume it). */
  announce(id: string): Promise<void> {
    return this.store.publish(HANDED_ON_CHANNEL, id).catch(() => undefined);
  }

  /** The frontend is shutting down: it takes nothing over any more (what it hands on goes to the others). */
  retire(): void {
    this.closing = true;
  }

  async close(): Promise<void> {
    this.closing = true;
    clearInterval(this.renewals);
    this.flushAll();
    for (const r of this.replicas.values()) r.cancel(new Error('the frontend is closing'));
    await this.store.close();
  }

  private track(lease: StreamLease): StreamLease {
    this.held.add(lease);
    // A lease's life ends with its stream: stopped renewing once it is over.
    lease.onOver = () => this.held.delete(lease);
    return lease;
  }

  private flushAll(): void {
    clearTimeout(this.batchTimer);
    this.batchTimer = undefined;
    this.together(() => {
      for (const lease of this.toFlush) lease.flush();
      this.toFlush.clear();
      this.flushNow();
    });
  }

  private flushNow(): void {
    clearImmediate(this.batchSoon);
    this.batchSoon = undefined;
    this.together(() => {
      for (const lease of this.toFlushNow) lease.flush();
      this.toFlushNow.clear();
    });
  }

  /**
   * Runs a flush with its streams' batches sent in one script (APPEND_MANY: one command, where
   * there was one per stream), except on a Redis Cluster, where each stream's keys are in their own slot.
   */
  private together(flush: () => void): void {
    if (this.collected !== undefined || this.store.address.kind === 'cluster') return flush();
    const batch: Collected[] = (this.collected = []);
    try {
      flush();
    } finally {
      this.collected = undefined;
      this.sendTogether(batch);
    }
  }

  private sendTogether(all: Collected[]): void {
    // A script holds Redis while it runs: a flush of thousands of streams goes as several, each of a bounded size.
    for (let at = 0; at < all.length; at += APPEND_MANY_MAX) this.sendOne(all.slice(at, at + APPEND_MANY_MAX));
  }

  private sendOne(batch: Collected[]): void {
    if (batch.length === 0) return;
    if (batch.length === 1) {
      const c = batch[0]!;
      // Not opening the stream: without the plan and tenant (APPEND opens it when they are there).
      this.redis.ebbAppend(...c.keys, ...(c.args[7] === '' ? c.args.slice(0, 7) : c.args)).then(c.resolve, c.reject);
      return;
    }
    this.redis.ebbAppendMany(batch.length * 3, ...batch.flatMap((c) => c.keys), ...batch.flatMap((c) => c.args)).then(
      (answers) => batch.forEach((c, i) => c.resolve(answers[i] ?? 'resync')),
      (err: unknown) => batch.forEach((c) => c.reject(err)),
    );
  }

  private token(): string {
    return `${this.opts.owner}:${randomUUID()}`;
  }

  /** A read a resume needs: Redis away is the 503 that says so. */
  private async read<T>(op: () => Promise<T>): Promise<T> {
    try {
      return await op();
    } catch (err) {
      throw new EbbError('stream_store_unavailable', `the stream store (Redis) cannot be reached: ${(err as Error).message}`);
    }
  }
}

/** The last event of a stream followed elsewhere that cannot go on: an error saying why, in the stream's own format (never a silent cut). */
export function gone(id: string, why: string): string {
  const message = `response ${id} cannot be continued: ${why} (retry the request)`;
  const error = { message, type: 'server_error', param: null, code: 'stream_lost' };
  if (id.startsWith('resp_')) return `event: error\ndata: ${JSON.stringify({ type: 'error', code: 'stream_lost', message, param: null, error })}\n\n`;
  return `data: ${JSON.stringify({ error })}\n\n`;
}
