import { Etcd3, isRecoverableError, type IKeyValue, type Lease, type Watcher } from 'etcd3';
import { isWorkerRecord, type Discovery, type DiscoveryOptions, type DiscoveryEvent, type DiscoveryWatch, type WorkerRecord } from './discovery.js';

/** Every record lives at `<prefix><model>/<worker_id>` (both URI-encoded: model names contain `/`). */
export const ETCD_PREFIX = '/ebb/v1/instances/';

const DEFAULT_LEASE_TTL_MS = 10_000;
/** etcd silently raises shorter TTLs to its minimum (about 2 s with default election settings). */
const MIN_LEASE_TTL_S = 2;
/** Unary calls only: a black-holed etcd must fail register/list, not hang them. */
const UNARY_DEADLINE_MS = 5_000;
/** close() must finish even when etcd is gone. */
const CLOSE_BOUND_MS = 2_000;
const RESYNC_RETRY_MIN_MS = 250;
const RESYNC_RETRY_MAX_MS = 5_000;
const WATCH_BACKOFF_MIN_MS = 100;
/**
 * etcd3's default watch reconnect backoff grows to 30 s, and its WatchManager arms a (referenced)
 * reconnect timer for every stream error and end, even when the stream ended because we closed it.
 * Capping the backoff bounds both how late a frontend notices etcd is back and how long those
 * stray timers can hold the process open after close().
 */
const WATCH_BACKOFF_MAX_MS = 2_000;

/** Consecutive recoverable failures of one etcd host before calls to it are refused for a while. */
const BREAKER_THRESHOLD = 3;
/** Upper bound of that while; see HostBreaker. */
const BREAKER_OPEN_MAX_MS = 5_000;

export function etcdKey(record: Pick<WorkerRecord, 'model' | 'worker_id'>): string {
  return `${ETCD_PREFIX}${encodeURIComponent(record.model)}/${encodeURIComponent(record.worker_id)}`;
}

/** The worker id is the key's last segment; undefined for a key that is not ours. */
export function workerIdFromKey(key: string): string | undefined {
  if (!key.startsWith(ETCD_PREFIX)) return undefined;
  const segment = key.slice(key.lastIndexOf('/') + 1);
  if (segment === '') return undefined;
  try {
    return decodeURIComponent(segment);
  } catch {
    return undefined;
  }
}

/** `etcd://host:2379[,host2:2379]` -> `['http://host:2379', 'http://host2:2379']`. */
export function parseEtcdUrl(url: string): string[] {
  if (!url.startsWith('etcd://')) throw new Error(`not an etcd URL: "${url}" (expected etcd://host:2379[,host:2379])`);
  const authority = url.slice('etcd://'.length).replace(/\/.*$/, '');
  const hosts = authority.split(',').map((h) => h.trim());
  if (hosts.length === 0 || hosts.some((h) => h === '')) {
    throw new Error(`no etcd host in "${url}" (expected etcd://host:2379[,host:2379])`);
  }
  return hosts.map((h) => `http://${/:\d+$/.test(h) ? h : `${h}:2379`}`);
}

function parseRecord(kv: IKeyValue): WorkerRecord | undefined {
  try {
    const value: unknown = JSON.parse(kv.value.toString('utf8'));
    return isWorkerRecord(value) ? value : undefined;
  } catch {
    return undefined; // someone else's junk under our prefix must not break the frontend
  }
}

function nextRevision(revision: string): string {
  return (BigInt(revision) + 1n).toString();
}

function message(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** Resolves when `work` settles or after `ms`, whichever is first; never rejects. */
async function bounded(work: Promise<unknown>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    work.catch(() => undefined),
    new Promise<void>((resolve) => {
      timer = setTimeout(resolve, ms);
    }),
  ]);
  clearTimeout(timer);
}

/** Structurally a cockatiel IBackoff (etcd3's backoff type), without depending on cockatiel. */
interface WatchBackoff {
  readonly duration: number;
  next(): WatchBackoff;
}

function watchBackoff(attempt = 0): WatchBackoff {
  const ceiling = Math.min(WATCH_BACKOFF_MAX_MS, WATCH_BACKOFF_MIN_MS * 2 ** attempt);
  return {
    duration: ceiling / 2 + (Math.random() * ceiling) / 2, // jitter: frontends must not reconnect in lockstep
    next: () => watchBackoff(Math.min(attempt + 1, 16)),
  };
}

type HostPolicy = ReturnType<NonNullable<NonNullable<NonNullable<ConstructorParameters<typeof Etcd3>[0]>['faultHandling']>['host']>>;

/**
 * Per-host circuit breaker for the etcd3 client, structurally the cockatiel policy it expects (etcd3
 * only calls execute()). etcd3's default opens for 5 s after 3 consecutive failures, and while open
 * every call fails without reaching etcd. After an outage longer than the leases, etcd comes back
 * with the lost leases renewed for about one TTL (then they expire and take the old keys along);
 * with a 5 s breaker, re-registrations kept failing past that, so with short TTLs frontends dropped
 * every worker for seconds while etcd and all workers were healthy. Here the open period is a
 * quarter of the lease TTL (at most 5 s); one failure after it re-opens, one success closes.
 */
class HostBreaker {
  private failures = 0;
  private openUntil = 0;

  constructor(private readonly openMs: number) {}

  async execute<T>(fn: (context: { signal: AbortSignal }) => PromiseLike<T> | T, signal?: AbortSignal): Promise<T> {
    if (Date.now() < this.openUntil) {
      // etcd3 recognises this flag: the call never went through, so it may try another host.
      throw Object.assign(new Error('Execution prevented because the circuit breaker is open'), { isBrokenCircuitError: true });
    }
    try {
      const result = await fn({ signal: signal ?? new AbortController().signal });
      this.failures = 0;
      return result;
    } catch (err) {
      if (typeof err === 'object' && err !== null && isRecoverableError(err as Error)) {
        this.failures++;
        if (this.failures >= BREAKER_THRESHOLD) {
          this.openUntil = Date.now() + this.openMs;
          this.failures = BREAKER_THRESHOLD - 1; // half-open afterwards: the next failure re-opens
        }
      }
      throw err;
    }
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref());
}

interface Registration {
  key: string;
  record: WorkerRecord;
  lease: Lease;
}

interface Snapshot {
  revision: string;
  records: WorkerRecord[];
}

/**
 * Cluster discovery on etcd. Each process holds one lease for all the records it registers; the
 * etcd3 client keeps it alive, and etcd deletes the keys when the process stops keeping it alive
 * (crash, partition). Watchers list, then watch from the listed revision, and list again after
 * any reconnect so a restarted or replaced etcd cannot leave the frontend with a stale view.
 */
export class EtcdDiscovery implements Discovery {
  private lease: Lease | undefined;
  /** Lost leases etcd may still hold (it renews leases when it restarts): revoked once etcd answers again. */
  private readonly lostLeases = new Set<Lease>();
  private readonly registrations = new Map<string, Registration>();
  private readonly lostListeners = new Set<(workerId: string) => void>();
  private readonly watches = new Set<PrefixWatch>();
  private closed = false;

  private constructor(
    readonly url: string,
    private readonly client: Etcd3,
    private readonly leaseTtlS: number,
  ) {}

  /** Builds the client without contacting etcd: an unreachable etcd surfaces on first use. */
  static async connect(url: string, opts: DiscoveryOptions = {}): Promise<EtcdDiscovery> {
    const hosts = parseEtcdUrl(url);
    const ttlS = Math.max(MIN_LEASE_TTL_S, Math.ceil((opts.leaseTtlMs ?? DEFAULT_LEASE_TTL_MS) / 1000));
    const breakerOpenMs = Math.min(BREAKER_OPEN_MAX_MS, (ttlS * 1000) / 4);
    const client = new Etcd3({
      hosts,
      // Streams (watch, keepalive) are long-lived and must not get a deadline.
      defaultCallOptions: (ctx) => (ctx.isStream ? {} : { deadline: Date.now() + UNARY_DEADLINE_MS }),
      faultHandling: {
        watchBackoff: watchBackoff(),
        host: () => new HostBreaker(breakerOpenMs) as unknown as HostPolicy,
      },
    });
    return new EtcdDiscovery(url, client, ttlS);
  }

  private fail(action: string, err: unknown): Error {
    return new Error(`etcd discovery at ${this.url}: ${action} failed: ${message(err)}`, { cause: err });
  }

  private assertOpen(): void {
    if (this.closed) throw new Error(`etcd discovery at ${this.url} is closed`);
  }

  /** Lazily granted and shared; a lost lease is dropped so the next register grants a fresh one. */
  private currentLease(): Lease {
    if (this.lease && !this.lease.revoked()) return this.lease;
    const lease = this.client.lease(this.leaseTtlS);
    lease.on('lost', () => this.leaseLost(lease));
    this.lease = lease;
    return lease;
  }

  /**
   * The keys bound to this lease are gone (or will be). The worker decides whether to come back,
   * so tell it rather than re-putting: a draining worker must not resurrect itself. No new lease
   * is granted here; that would spin while etcd is unreachable. register() grants one on demand.
   */
  private leaseLost(lease: Lease): void {
    if (this.lease === lease) this.lease = undefined;
    if (this.closed) return;
    this.lostLeases.add(lease);
    for (const [workerId, reg] of this.registrations) {
      if (reg.lease !== lease) continue;
      for (const listener of this.lostListeners) {
        // Off the etcd3 keepalive call stack: a throwing listener must not wedge the client.
        queueMicrotask(() => listener(workerId));
      }
    }
  }

  async register(record: WorkerRecord): Promise<void> {
    this.assertOpen();
    const key = etcdKey(record);
    const lease = this.currentLease();
    try {
      await lease.put(key).value(JSON.stringify(record)).exec();
    } catch (err) {
      throw this.fail(`register ${record.worker_id}`, err);
    }
    if (lease.revoked()) {
      // Lost while the put was in flight: nobody will be told about this registration.
      throw this.fail(`register ${record.worker_id}`, new Error('lease lost during registration, retry'));
    }
    const previous = this.registrations.get(record.worker_id);
    this.registrations.set(record.worker_id, { key, record: { ...record }, lease });
    this.revokeLostLeases();
    if (previous && previous.key !== key) {
      // Re-registered under another model: the old key would otherwise live as long as the lease.
      await this.deleteKey(previous.key, `remove old key of ${record.worker_id}`);
    }
  }

  /**
   * etcd is reachable again and the worker has started re-registering. Keys still on a lost lease
   * belong to workers that chose not to come back; without this they would reappear for one TTL
   * after an etcd restart. A key re-registered meanwhile has moved to the new lease and is safe.
   */
  private revokeLostLeases(): void {
    for (const old of this.lostLeases) {
      this.lostLeases.delete(old);
      old.revoke().catch(() => undefined); // best effort: otherwise it simply expires
    }
  }

  async unregister(workerId: string): Promise<void> {
    this.assertOpen();
    const reg = this.registrations.get(workerId);
    this.registrations.delete(workerId);
    // The lease stays: other records of this process are bound to it.
    if (reg) return this.deleteKey(reg.key, `unregister ${workerId}`);
    // Not ours (or registered before a restart of this process): find it by id, like the other backends.
    let keys: string[];
    try {
      keys = await this.client.getAll().prefix(ETCD_PREFIX).keys();
    } catch (err) {
      throw this.fail(`unregister ${workerId}`, err);
    }
    for (const key of keys) if (workerIdFromKey(key) === workerId) await this.deleteKey(key, `unregister ${workerId}`);
  }

  private async deleteKey(key: string, action: string): Promise<void> {
    try {
      await this.client.delete().key(key).exec();
    } catch (err) {
      throw this.fail(action, err);
    }
  }

  /** The listed set and the revision it was read at, so a watch can continue from it. */
  private async snapshot(): Promise<Snapshot> {
    let res;
    try {
      res = await this.client.getAll().prefix(ETCD_PREFIX).exec();
    } catch (err) {
      throw this.fail('list', err);
    }
    const records = res.kvs.map(parseRecord).filter((r): r is WorkerRecord => r !== undefined);
    return { revision: res.header.revision, records };
  }

  async list(): Promise<WorkerRecord[]> {
    this.assertOpen();
    return (await this.snapshot()).records;
  }

  async watch(listener: (event: DiscoveryEvent) => void): Promise<DiscoveryWatch> {
    this.assertOpen();
    const watch = new PrefixWatch(this.client, () => this.snapshot(), listener, (w) => this.watches.delete(w));
    this.watches.add(watch);
    try {
      await watch.start();
    } catch (err) {
      await watch.close();
      throw err;
    }
    return watch;
  }

  onRegistrationLost(listener: (workerId: string) => void): () => void {
    this.lostListeners.add(listener);
    return () => void this.lostListeners.delete(listener);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await Promise.all([...this.watches].map((w) => w.close()));
    // Revoking deletes our keys at once instead of after the TTL; leases that were lost may
    // still hold keys if etcd restarted (it renews leases on startup), so revoke those too.
    const leases = new Set<Lease>([...this.registrations.values()].map((r) => r.lease));
    for (const old of this.lostLeases) leases.add(old);
    if (this.lease) leases.add(this.lease);
    this.lease = undefined;
    this.lostLeases.clear();
    this.registrations.clear();
    this.lostListeners.clear();
    await bounded(Promise.all([...leases].map((l) => l.revoke())), CLOSE_BOUND_MS);
    this.client.close();
  }
}

/**
 * One watch of the whole prefix. Events from a watcher are only delivered while it is the
 * current generation: a resync bumps the generation, lists, sends `reset` and starts a new
 * watcher from the listed revision, so nothing is lost or replayed out of order.
 */
class PrefixWatch implements DiscoveryWatch {
  private watcher: Watcher | undefined;
  private generation = 0;
  private resyncing = false;
  private closed = false;

  constructor(
    private readonly client: Etcd3,
    private readonly snapshot: () => Promise<Snapshot>,
    private readonly listener: (event: DiscoveryEvent) => void,
    private readonly onClosed: (w: PrefixWatch) => void,
  ) {}

  async start(): Promise<void> {
    const snap = await this.snapshot();
    this.listener({ type: 'reset', records: snap.records });
    this.follow(snap.revision);
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
      if (record) this.listener({ type: 'put', record });
    });
    watcher.on('delete', (kv) => {
      if (!current()) return;
      const workerId = workerIdFromKey(kv.key.toString('utf8'));
      if (workerId !== undefined) this.listener({ type: 'delete', worker_id: workerId });
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
    void old?.cancel().catch(() => undefined);
    void this.relist();
  }

  private async relist(): Promise<void> {
    let delay = RESYNC_RETRY_MIN_MS;
    try {
      while (!this.closed) {
        let snap: Snapshot;
        try {
          snap = await this.snapshot();
        } catch {
          // etcd is flapping or still electing: keep trying, the frontend keeps its last view.
          await sleep(delay);
          delay = Math.min(delay * 2, RESYNC_RETRY_MAX_MS);
          continue;
        }
        if (this.closed) return;
        this.listener({ type: 'reset', records: snap.records });
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
    this.onClosed(this);
    const watcher = this.watcher;
    this.watcher = undefined;
    if (watcher) await bounded(watcher.cancel(), CLOSE_BOUND_MS);
  }
}
