import type { Etcd3, Watcher } from 'etcd3';
import { Backoff, pause } from '../common/backoff.js';
import { bounded, callListener, warn } from './guards.js';
import { isLoading, type AnyRecord, type DiscoveryWatch, type FleetEvent, type LoadingRecord, type WorkerRecord } from './discovery.js';
import { ETCD_PREFIX, nextRevision, parseRecord, workerIdFromKey } from './etcd-keys.js';

/** After a failed re-list; every frontend re-lists at once when etcd comes back. */
const RESYNC_RETRY = { minMs: 250, maxMs: 5_000, jitter: true };
/** close() must finish even when etcd is gone. */
export const CLOSE_BOUND_MS = 2_000;

export interface Snapshot {
  revision: string;
  /** Serving and loading records. */
  records: AnyRecord[];
  /** Every key under the prefix, junk included: what a registrar checks its own keys against. */
  keys: Set<string>;
  /** Opaque to the watch: the caller's own marker of what it had written when it asked for this list. */
  asked?: number;
}

/** Where an event sits in etcd's history, so a registrar can order it against its own writes. */
export interface EventContext {
  /** The snapshot's revision for a reset, the change's mod revision otherwise. */
  revision: bigint;
  /** The changed key (put, delete). */
  key?: string;
  /** The list a reset carries. */
  snapshot?: Snapshot;
}

export type PrefixListener = (event: FleetEvent, ctx: EventContext) => void;

/**
 * One watch of the whole prefix. Events from a watcher are only delivered while it is the
 * current generation: a resync bumps the generation, lists, sends `reset` and starts a new
 * watcher from the listed revision, so nothing is lost or replayed out of order.
 */
export class PrefixWatch implements DiscoveryWatch {
  private watcher: Watcher | undefined;
  private generation = 0;
  private resyncing = false;
  private closed = false;
  /** Aborted by close(): a re-list waiting to retry stops at once. */
  private readonly stop = new AbortController();

  constructor(
    private readonly client: Etcd3,
    private readonly snapshot: () => Promise<Snapshot>,
    private readonly listener: PrefixListener,
    private readonly onClosed: (w: PrefixWatch) => void,
  ) {}

  private deliver(event: FleetEvent, ctx: EventContext): void {
    callListener('watch', this.listener, event, ctx);
  }

  private deliverReset(snap: Snapshot): void {
    const records: WorkerRecord[] = [];
    const loading: LoadingRecord[] = [];
    for (const r of snap.records) {
      if (isLoading(r)) loading.push(r);
      else records.push(r);
    }
    this.deliver({ type: 'reset', records, loading }, { revision: BigInt(snap.revision), snapshot: snap });
  }

  /** Lists (failing if etcd does not answer), delivers the reset, then follows from there. */
  async start(): Promise<void> {
    const snap = await this.snapshot();
    this.deliverReset(snap);
    this.follow(snap.revision);
  }

  /** Like start(), but never fails: lists until etcd answers, however long that takes. */
  begin(): void {
    this.resyncing = true;
    this.relist().catch((err: unknown) => warn('relist', err));
  }

  private follow(revision: string): void {
    const generation = ++this.generation;
    // watcher() rather than create(): listeners must be attached before the first event can
    // arrive, and create() only hands the watcher over a tick after it has connected.
    const watcher = this.client.watch().prefix(ETCD_PREFIX).startRevision(nextRevision(revision)).watcher();
    this.watcher = watcher;
    const current = () => !this.closed && generation === this.generation;
    // 'disconnected' repeats on every failed reconnect attempt; one resync per episode.
    let disconnected = false;
    watcher.on('put', (kv) => {
      if (!current()) return;
      const record = parseRecord(kv);
      if (record) this.deliver(isLoading(record) ? { type: 'loading', record } : { type: 'put', record }, { revision: BigInt(kv.mod_revision), key: kv.key.toString('utf8') });
    });
    watcher.on('delete', (kv) => {
      if (!current()) return;
      const key = kv.key.toString('utf8');
      const workerId = workerIdFromKey(key);
      if (workerId !== undefined) this.deliver({ type: 'delete', worker_id: workerId }, { revision: BigInt(kv.mod_revision), key });
    });
    watcher.on('disconnected', () => {
      disconnected = true;
    });
    watcher.on('connected', () => {
      // The client replays from its last revision on reconnect, but that is wrong if etcd came
      // back with other data (restored or replaced): list again and start over from there.
      if (disconnected && current()) this.resync();
      disconnected = false;
    });
    // Fatal for this watcher (e.g. its revision was compacted away): start over from a list.
    watcher.on('error', () => {
      if (current()) this.resync();
    });
  }

  private resync(): void {
    if (this.closed || this.resyncing) return;
    this.resyncing = true;
    this.generation++; // silence the old watcher right away; the reset supersedes what it would say
    const old = this.watcher;
    this.watcher = undefined;
    old?.cancel().catch(() => undefined);
    this.relist().catch((err: unknown) => warn('relist', err));
  }

  /** Never rejects for etcd's sake: a failed list is retried, and the listener keeps its last view. */
  private async relist(): Promise<void> {
    const backoff = new Backoff(RESYNC_RETRY);
    try {
      while (!this.closed) {
        let snap: Snapshot;
        try {
          snap = await this.snapshot();
        } catch {
          // etcd is flapping or still electing: keep trying, the frontend keeps its last view.
          if (!(await pause(backoff.next(), this.stop.signal))) return;
          continue;
        }
        if (this.closed) return;
        this.deliverReset(snap);
        this.follow(snap.revision);
        return;
      }
    } finally {
      this.resyncing = false;
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.stop.abort();
    this.onClosed(this);
    const watcher = this.watcher;
    this.watcher = undefined;
    if (watcher) await bounded(watcher.cancel(), CLOSE_BOUND_MS);
  }
}
