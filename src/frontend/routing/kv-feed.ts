import type { Logger } from 'pino';
import { Agent } from 'undici';
import type { DiscoveryEvent, WorkerRecord } from '../../discovery/discovery.js';
import type { BlockHash } from '../../protocol/block-hash.js';
import type { KvSnapshot } from '../../protocol/kv-events.js';
import { KvIndex } from './kv-index.js';
import { httpKvSource, KV_CONNECT_TIMEOUT_MS, KvSubscription, type KvEventSource, type KvEventTap } from './kv-subscription.js';
import { kvProfile, type KvProfile } from './prompt-blocks.js';
import { SharedLoad } from './shared-load.js';
import { bearerHeader } from '../../common/admin-auth.js';

export interface KvFeedOptions {
  /** How long a block the frontend sent a worker that publishes no events counts as cached (default 120 s). */
  approximateTtlMs?: number | undefined;
  /** Most blocks remembered per such worker; the oldest go first (default 65,536). */
  approximateMaxBlocks?: number | undefined;
  /** Most departed workers whose entries are kept, masked, for a warm resume (default 256). */
  departedMax?: number | undefined;
  /** The admin token presented to workers' /kv/events (which require it where the worker has one). */
  workerAdminToken?: string | undefined;
  /**
   * Where a worker's events come from; default its own /kv/events. A child of `--processes N` reads
   * the primary's copy (cluster/kv-relay.ts): one subscription per frontend host, not per process.
   */
  source?: ((record: WorkerRecord) => KvEventSource) | undefined;
  /** Told every event applied, and every stream that broke (the primary passes them on). */
  tap?: KvFeedTap | undefined;
  /** This frontend's name on the request plane: the workers' load events list it among the others. */
  self?: string | undefined;
}

export interface KvFeedTap {
  event: KvEventTap;
  broken(workerId: string, reason: string): void;
}

export const DEFAULT_APPROXIMATE_TTL_MS = 120_000;
export const DEFAULT_APPROXIMATE_MAX_BLOCKS = 65_536;
export const DEFAULT_DEPARTED_MAX = 256;

/** The incarnation of an approximate holder: its addresses (a worker that moved is a new one). */
const approxIncarnation = (r: WorkerRecord) => `${r.request_url} ${r.system_url}`;

/**
 * Keeps the KV index in step with discovery: a `/kv/events` subscription per worker that publishes
 * events, approximate entries for the others. A worker that leaves discovery (drain, lost lease)
 * keeps its entries masked: while its stream still answers its cache is real, and a resume is warm
 * at once. Its entries go when its stream fails while it is out of discovery (it stopped), when it
 * restarts (new incarnation), after the approximate TTL, or past `departedMax` departed workers.
 */
export class KvFeed {
  readonly index = new KvIndex();
  /** What other frontends have in flight on each worker (its load events). */
  readonly load: SharedLoad;
  private readonly subs = new Map<string, KvSubscription>();
  private readonly inView = new Map<string, WorkerRecord>();
  /** Departed workers still indexed, oldest departure first. */
  private readonly departed = new Map<string, NodeJS.Timeout | undefined>();
  /** Per model, the distinct token spaces of its workers in discovery; rebuilt after a change. */
  private readonly spaces = new Map<string, KvProfile[]>();
  private readonly agent = new Agent({ connect: { timeout: KV_CONNECT_TIMEOUT_MS }, headersTimeout: KV_CONNECT_TIMEOUT_MS, bodyTimeout: 0 });
  readonly ttlMs: number;
  readonly maxBlocks: number;
  private readonly departedMax: number;
  private readonly source: (record: WorkerRecord) => KvEventSource;
  private readonly tap: KvFeedTap | undefined;

  constructor(
    private readonly log: Logger,
    opts: KvFeedOptions = {},
  ) {
    this.ttlMs = opts.approximateTtlMs ?? DEFAULT_APPROXIMATE_TTL_MS;
    this.maxBlocks = opts.approximateMaxBlocks ?? DEFAULT_APPROXIMATE_MAX_BLOCKS;
    this.departedMax = opts.departedMax ?? DEFAULT_DEPARTED_MAX;
    const headers = bearerHeader(opts.workerAdminToken);
    this.source = opts.source ?? ((r) => httpKvSource(r.system_url, this.agent, headers));
    this.tap = opts.tap;
    this.load = new SharedLoad(opts.self ?? '');
  }

  apply(event: DiscoveryEvent): void {
    this.spaces.clear();
    if (event.type === 'reset') {
      const next = new Set(event.records.map((r) => r.worker_id));
      for (const id of [...this.inView.keys()]) if (!next.has(id)) this.depart(id);
      for (const r of event.records) this.put(r);
    } else if (event.type === 'put') this.put(event.record);
    else this.depart(event.worker_id);
  }

  /**
   * The token spaces (tokenizer, block size) the workers of `model` use: what a prompt is hashed in.
   * Read per request, computed once per discovery change, so a decision does not visit every worker for it.
   */
  spacesOf(model: string): readonly KvProfile[] {
    let out = this.spaces.get(model);
    if (out !== undefined) return out;
    const byKey = new Map<string, KvProfile>();
    for (const r of this.inView.values()) {
      if (r.model !== model) continue;
      const p = kvProfile(r);
      byKey.set(p.key, p);
    }
    this.spaces.set(model, (out = [...byKey.values()]));
    return out;
  }

  /** Whether a worker's stream delivered its snapshot (exact), or it is approximated; for /workers. */
  describe(workerId: string): { mode: 'exact' | 'approximate'; cached_blocks: number; masked: boolean; stream: 'connected' | 'connecting' | null } | null {
    const h = this.index.holder(workerId);
    const sub = this.subs.get(workerId);
    if (!h && !sub) return null;
    return {
      mode: sub ? 'exact' : 'approximate',
      cached_blocks: h?.blocks.size ?? 0,
      masked: h?.masked ?? !this.inView.has(workerId),
      stream: sub ? (sub.connected ? 'connected' : 'connecting') : null,
    };
  }

  /**
   * What a fresh subscriber of this worker's stream would be sent first, from what this feed holds
   * now (the primary's answer to a child that follows the worker); undefined until a snapshot came.
   */
  snapshotOf(workerId: string): { record: WorkerRecord; snapshot: KvSnapshot } | undefined {
    const sub = this.subs.get(workerId);
    const h = this.index.holder(workerId);
    if (!sub?.connected || sub.incarnation === undefined || h === undefined || h.kind !== 'exact') return undefined;
    const snapshot = { worker_id: workerId, incarnation: sub.incarnation, seq: sub.seq, block_size: kvProfile(sub.record).blockSize, blocks: [...h.blocks.keys()], ...(h.capacityBlocks > 0 && { capacity_blocks: h.capacityBlocks }) };
    return { record: sub.record, snapshot };
  }

  /** Approximate mode: `worker` was sent a prompt with these blocks; they count as cached there for the TTL. */
  sent(record: WorkerRecord, hashes: readonly BlockHash[], now = Date.now()): void {
    if (!this.inView.has(record.worker_id) || this.subs.has(record.worker_id)) return;
    const inc = approxIncarnation(record);
    let h = this.index.holder(record.worker_id);
    if (!h || h.kind !== 'approximate' || h.incarnation !== inc) h = this.index.replace(record.worker_id, record.model, 'approximate', inc);
    const expiry = now + this.ttlMs;
    for (const hash of hashes) this.index.add(h, hash, expiry);
    this.index.trim(h, now, this.maxBlocks);
  }

  private put(r: WorkerRecord): void {
    const id = r.worker_id;
    this.inView.set(id, r);
    const timer = this.departed.get(id);
    if (timer) clearTimeout(timer);
    this.departed.delete(id);
    const exact = kvProfile(r).events === 'exact';
    const sub = this.subs.get(id);
    if (exact) {
      if (sub && sub.url === r.system_url && sub.record.model === r.model) {
        const h = this.index.holder(id);
        if (h) h.masked = false;
        return;
      }
      if (sub) this.closeSub(sub, 'the worker moved or changed model');
      this.index.drop(id);
      this.subs.set(
        id,
        new KvSubscription(
          r,
          this.index,
          this.source(r),
          () => this.inView.has(id),
          (s, reason) => this.failed(s, reason),
          (s, seq, snapshot) => this.indexed(s, seq, snapshot),
          this.tap?.event,
          (s, data) => this.subs.get(id) === s && this.loaded(id, data),
        ),
      );
      return;
    }
    if (sub) {
      this.closeSub(sub, 'the worker no longer publishes KV events');
      this.subs.delete(id);
      this.index.drop(id);
    }
    const h = this.index.holder(id);
    if (h && (h.kind !== 'approximate' || h.incarnation !== approxIncarnation(r) || h.model !== r.model)) this.index.drop(id);
    else if (h) h.masked = false;
  }

  private depart(id: string): void {
    if (!this.inView.delete(id)) return;
    const h = this.index.holder(id);
    if (h) h.masked = true;
    if (!h && !this.subs.has(id)) return;
    // Approximate entries have no stream to say the worker is gone: they last their TTL, no longer.
    const timer = this.subs.has(id) ? undefined : setTimeout(() => this.forget(id), this.ttlMs).unref();
    this.departed.set(id, timer);
    for (const old of this.departed.keys()) {
      if (this.departed.size <= this.departedMax) break;
      this.forget(old);
    }
  }

  /** A stream failed: a worker out of discovery whose stream fails is gone; one in it is retried. */
  private failed(sub: KvSubscription, reason: string): void {
    const id = sub.record.worker_id;
    if (this.subs.get(id) !== sub) return;
    this.load.drop(id);
    this.tap?.broken(id, reason);
    if (!this.inView.has(id)) {
      this.log.info({ event: 'kv_index_purged', worker_id: id, reason }, `KV index: worker ${id} left discovery and its KV event stream failed (${reason}): its entries are dropped`);
      this.forget(id);
      return;
    }
    this.log.debug({ event: 'kv_stream_failed', worker_id: id, reason }, `KV event stream of ${id}: ${reason}; resubscribing`);
  }

  /** A worker's load event: what the other frontends have there now (false: not one). */
  private loaded(id: string, data: unknown): boolean {
    if (!this.load.apply(id, data)) return false;
    if (this.log.isLevelEnabled('debug')) {
      const o = this.load.of(id);
      this.log.debug({ event: 'kv_load', worker_id: id, inflight: o?.inflight ?? 0, queued_prefill_tokens: o?.prefillSum ?? 0 }, `KV load: other frontends have ${o?.inflight ?? 0} requests on ${id}, ${o?.prefillSum ?? 0} prompt tokens of them not yet prefilled`);
    }
    return true;
  }

  private indexed(sub: KvSubscription, seq: number, snapshot: boolean): void {
    const id = sub.record.worker_id;
    const blocks = this.index.holder(id)?.blocks.size ?? 0;
    if (snapshot) this.log.info({ event: 'kv_stream_connected', worker_id: id, seq, cached_blocks: blocks }, `KV index: ${id}'s event stream connected (${blocks} blocks cached there)`);
    else if (this.log.isLevelEnabled('debug')) this.log.debug({ event: 'kv_indexed', worker_id: id, seq, cached_blocks: blocks }, `KV index: ${id} batch ${seq}, ${blocks} blocks`);
  }

  private forget(id: string): void {
    const timer = this.departed.get(id);
    if (timer) clearTimeout(timer);
    this.departed.delete(id);
    if (this.inView.has(id)) return;
    const sub = this.subs.get(id);
    if (sub) this.closeSub(sub, 'the worker is gone');
    this.subs.delete(id);
    this.index.drop(id);
  }

  /** Closes a subscription for good; whoever follows its events through the tap is told. */
  private closeSub(sub: KvSubscription, reason: string): void {
    sub.close();
    this.load.drop(sub.record.worker_id);
    this.tap?.broken(sub.record.worker_id, reason);
  }

  async close(): Promise<void> {
    for (const s of this.subs.values()) s.close();
    this.subs.clear();
    for (const t of this.departed.values()) if (t) clearTimeout(t);
    this.departed.clear();
    await this.agent.close().catch(() => undefined);
  }
}
