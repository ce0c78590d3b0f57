import { request, type Agent } from 'undici';
import { Backoff, pause } from '../../common/backoff.js';
import { readSse } from '../../common/sse-hub.js';
import { failureReason, identityMismatch } from '../../common/worker-admin.js';
import type { WorkerRecord } from '../../discovery/discovery.js';
import type { KvEvent, KvEventBatch, KvLoad, KvSnapshot } from '../../protocol/kv-events.js';
import type { Holder, KvIndex } from './kv-index.js';
import { discardBody } from '../../common/discard-body.js';

/** Reconnect back-off for a worker's KV event stream that ended, failed or skipped a seq. */
const RESUBSCRIBE = { minMs: 250, maxMs: 5000, jitter: true };
/** Bound on the stream request's headers; the stream itself then lasts. */
export const KV_CONNECT_TIMEOUT_MS = 2000;
/**
 * Bound on one event: a snapshot lists every block a worker holds (a 100k-block cache is about
 * 1.7 MB of JSON); a peer sending an endless event must not grow the frontend past this.
 */
export const KV_EVENT_MAX_CHARS = 32 * 1024 * 1024;

const isHashes = (v: unknown): v is number[] => Array.isArray(v) && v.every((h) => Number.isSafeInteger(h) && h >= 0);

function isSnapshot(v: unknown): v is KvSnapshot {
  const s = v as Partial<KvSnapshot> | null;
  return typeof s === 'object' && s !== null && typeof s.worker_id === 'string' && typeof s.incarnation === 'string' && Number.isSafeInteger(s.seq) && isHashes(s.blocks);
}

function isBatch(v: unknown): v is KvEventBatch {
  const b = v as Partial<KvEventBatch> | null;
  return typeof b === 'object' && b !== null && typeof b.incarnation === 'string' && Number.isSafeInteger(b.seq) && Array.isArray(b.events);
}

export class StreamBroken extends Error {}

/** One worker's KV events as they arrive, until the stream ends (or throws why it broke). */
export type KvEventSource = (signal: AbortSignal) => AsyncIterable<{ event: string; data: unknown }>;

/** The worker's own GET /kv/events (with the admin token, which workers that have one require). */
export function httpKvSource(url: string, agent: Agent, headers: Record<string, string>): KvEventSource {
  return async function* (signal) {
    const res = await request(`${url}/kv/events`, { headers, dispatcher: agent, signal, headersTimeout: KV_CONNECT_TIMEOUT_MS, bodyTimeout: 0 });
    if (res.statusCode !== 200) {
      discardBody(res.body);
      throw new StreamBroken(`HTTP ${res.statusCode}`);
    }
    try {
      yield* readSse(res.body, KV_EVENT_MAX_CHARS);
    } finally {
      discardBody(res.body);
    }
  };
}

/** Told every event a subscription applied (the primary passes them on to its children). */
export type KvEventTap = (sub: KvSubscription, event: 'snapshot' | 'kv' | 'load', data: KvSnapshot | KvEventBatch | KvLoad) => void;

/**
 * One worker's KV event stream (its GET /kv/events, or the primary's copy of it in a child of
 * `--processes N`), feeding its holder in the index, reconnected with back-off until closed. The first event must be a snapshot naming the worker asked for (a system port can be
 * reused by another process): nothing is indexed before that. A seq gap, a new incarnation, or a
 * broken stream drops what the worker held: stale entries route worse than none. Reports each
 * failure to `onError` (the feed decides whether a departed worker is gone).
 */
export class KvSubscription {
  readonly url: string;
  private readonly abort = new AbortController();
  private readonly backoff = new Backoff(RESUBSCRIBE);
  /** Set once a stream delivered its snapshot; false again after a failure. */
  connected = false;
  /** The worker's engine incarnation and the last seq applied, while connected. */
  incarnation: string | undefined;
  seq = 0;

  constructor(
    readonly record: WorkerRecord,
    private readonly index: KvIndex,
    private readonly source: KvEventSource,
    /** Whether the worker is in the routing view now (its entries are masked while it is not). */
    private readonly inView: () => boolean,
    private readonly onError: (sub: KvSubscription, reason: string) => void,
    /** After a snapshot (seq) or a batch was indexed: the feed's log lines. */
    private readonly onIndexed: (sub: KvSubscription, seq: number, snapshot: boolean) => void = () => undefined,
    private readonly tap?: KvEventTap,
    /** The worker's `load` events: what other frontends have in flight there (false: not one). */
    private readonly onLoad?: (sub: KvSubscription, data: unknown) => boolean,
  ) {
    this.url = record.system_url;
    void this.run();
  }

  close(): void {
    this.abort.abort();
  }

  get closed(): boolean {
    return this.abort.signal.aborted;
  }

  private async run(): Promise<void> {
    while (!this.closed) {
      let reason: string;
      try {
        await this.readOnce();
        reason = 'KV event stream ended';
      } catch (err) {
        reason = err instanceof StreamBroken ? err.message : failureReason(err, KV_CONNECT_TIMEOUT_MS);
      }
      if (this.closed) return;
      this.connected = false;
      this.index.drop(this.record.worker_id);
      this.onError(this, reason);
      if (this.closed) return;
      await pause(this.backoff.next(), this.abort.signal);
    }
  }

  private async readOnce(): Promise<void> {
    const id = this.record.worker_id;
    let holder: Holder | undefined;
    this.incarnation = undefined;
    for await (const { event, data } of this.source(this.abort.signal)) {
      if (holder === undefined) {
        const answered = event === 'snapshot' ? (data as { worker_id?: unknown } | null)?.worker_id : undefined;
        if (answered !== id) throw new StreamBroken(identityMismatch(this.url, answered, id));
        if (!isSnapshot(data)) throw new StreamBroken('KV snapshot malformed');
        holder = this.index.replace(id, this.record.model, 'exact', data.incarnation);
        holder.masked = !this.inView();
        if (Number.isSafeInteger(data.capacity_blocks) && data.capacity_blocks! > 0) holder.capacityBlocks = data.capacity_blocks!;
        for (const h of data.blocks) this.index.add(holder, h);
        this.seq = data.seq;
        this.incarnation = data.incarnation;
        this.connected = true;
        this.backoff.reset();
        this.tap?.(this, 'snapshot', data);
        this.onIndexed(this, this.seq, true);
        continue;
      }
      if (event === 'load') {
        if (this.onLoad?.(this, data) === true) this.tap?.(this, 'load', data as KvLoad);
        continue;
      }
      if (event !== 'kv') continue;
      if (!isBatch(data)) throw new StreamBroken('KV event batch malformed');
      if (data.incarnation !== holder.incarnation) throw new StreamBroken('KV events from a new incarnation: the worker restarted');
      if (data.seq !== this.seq + 1) throw new StreamBroken(`KV event seq gap (${this.seq} then ${data.seq})`);
      this.seq = data.seq;
      for (const e of data.events) this.apply(holder, e);
      this.tap?.(this, 'kv', data);
      this.onIndexed(this, this.seq, false);
    }
  }

  private apply(holder: Holder, e: KvEvent): void {
    if (e.type === 'stored') {
      if (!isHashes(e.block_hashes)) throw new StreamBroken('KV stored event malformed');
      for (const h of e.block_hashes) this.index.add(holder, h);
      this.index.stored(holder, e.block_hashes.length, performance.now());
    } else if (e.type === 'removed') {
      if (!isHashes(e.block_hashes)) throw new StreamBroken('KV removed event malformed');
      for (const h of e.block_hashes) this.index.remove(holder, h);
    } else if (e.type === 'cleared') this.index.clear(holder);
  }
}
