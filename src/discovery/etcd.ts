import { EtcdScaleDownLocks } from './scale-down-lock.js';
import { Etcd3, EtcdLeaseInvalidError, type Lease } from 'etcd3';
import { EtcdDrainIntents } from './drain-intent.js';
import { EtcdRouteMarks } from './etcd-route-marks.js';
import { isLoading, type AnyRecord, type Discovery, type DiscoveryOptions, type DiscoveryEvent, type DiscoveryWatch, type FleetEvent, type WorkerRecord } from './discovery.js';
import { servingOnly } from './serving-only.js';
import { HostBreaker, watchBackoff, type HostPolicy } from './etcd-breaker.js';
import { ETCD_PREFIX, etcdKey, parseEtcdUrl, parseRecord, workerIdFromKey } from './etcd-keys.js';
import { CLOSE_BOUND_MS, PrefixWatch, type EventContext, type Snapshot } from './etcd-watch.js';
import { bounded, callListener } from './guards.js';

export { ETCD_PREFIX, etcdKey, parseEtcdUrl, workerIdFromKey } from './etcd-keys.js';

const DEFAULT_LEASE_TTL_MS = 10_000;
/** etcd silently raises shorter TTLs to its minimum (about 2 s with default election settings). */
const MIN_LEASE_TTL_S = 2;
/** Unary calls only: a black-holed etcd must fail register/list, not hang them. */
const UNARY_DEADLINE_MS = 5_000;

function message(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

interface Registration {
  key: string;
  record: AnyRecord;
  lease: Lease;
  /** The revision of our put: a delete older than it is history, not a loss. */
  revision: bigint;
  /** Local order of confirmed writes; a list asked for after this one must contain the key. */
  seq: number;
}

/**
 * Cluster discovery on etcd. Each process holds one lease for all the records it registers; the
 * etcd3 client keeps it alive, and etcd deletes the keys when the process stops keeping it alive
 * (crash, partition). Watchers list, then watch from the listed revision, and list again after
 * any reconnect so a restarted or replaced etcd cannot leave the frontend with a stale view.
 *
 * The registrations map is what this process believes it holds in etcd, so it changes only on
 * what etcd confirmed: a put, a delete, a lost lease, or (seen through a watch of the prefix, from
 * the first registration on) a key of ours deleted by someone else or missing after a reconnect.
 */
export class EtcdDiscovery implements Discovery {
  private lease: Lease | undefined;
  /** Lost leases etcd may still hold (it renews leases when it restarts): revoked once etcd answers again. */
  private readonly lostLeases = new Set<Lease>();
  private readonly revoking = new Map<Lease, Promise<void>>();
  private readonly registrations = new Map<string, Registration>();
  /** Keys with a delete of ours in flight; `seen` once the watch reported the key deleted. */
  private readonly deleting = new Map<string, { calls: number; seen: boolean }>();
  private readonly lostListeners = new Set<(workerId: string) => void>();
  private readonly watches = new Set<PrefixWatch>();
  /** Counts confirmed puts (see Registration.seq). */
  private writeSeq = 0;
  /** Watches our own keys; started by the first register, kept until close. */
  private ownWatch: PrefixWatch | undefined;
  private closed = false;

  readonly drainIntents: EtcdDrainIntents;
  readonly scaleDownLocks: EtcdScaleDownLocks;
  readonly routeMarks: EtcdRouteMarks;

  private constructor(
    readonly url: string,
    private readonly client: Etcd3,
    private readonly leaseTtlS: number,
  ) {
    this.drainIntents = new EtcdDrainIntents(client);
    this.scaleDownLocks = new EtcdScaleDownLocks(client);
    this.routeMarks = new EtcdRouteMarks(client);
  }

  /** Builds the client without contacting etcd: an unreachable etcd surfaces on first use. */
  static async connect(url: string, opts: DiscoveryOptions = {}): Promise<EtcdDiscovery> {
    const hosts = parseEtcdUrl(url);
    const ttlS = Math.max(MIN_LEASE_TTL_S, Math.ceil((opts.leaseTtlMs ?? DEFAULT_LEASE_TTL_MS) / 1000));
    const client = new Etcd3({
      hosts,
      // Streams (watch, keepalive) are long-lived and must not get a deadline.
      defaultCallOptions: (ctx) => (ctx.isStream ? {} : { deadline: Date.now() + UNARY_DEADLINE_MS }),
      faultHandling: {
        watchBackoff: watchBackoff(),
        host: () => HostBreaker.forLeaseTtl(ttlS) as unknown as HostPolicy,
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
    for (const [workerId, reg] of this.registrations) if (reg.lease === lease) this.registrationLost(workerId, reg);
  }

  /** Forgets a registration etcd no longer holds and tells the listeners, once per loss. */
  private registrationLost(workerId: string, reg: Registration): void {
    if (this.registrations.get(workerId) !== reg) return;
    this.registrations.delete(workerId);
    for (const listener of this.lostListeners) {
      // Off the etcd3 keepalive and watch call stacks: a listener must not wedge the client.
      queueMicrotask(() => callListener('registration-lost', listener, workerId));
    }
  }

  /** What the watch of our own keys says: a key we hold deleted, or absent when listed again. */
  private ownKeysEvent(event: FleetEvent, ctx: EventContext): void {
    if (this.closed) return;
    if (event.type === 'delete' && ctx.key !== undefined) {
      const mine = this.deleting.get(ctx.key);
      if (mine) {
        mine.seen = true;
        return;
      }
      const reg = this.registrations.get(event.worker_id);
      if (reg && reg.key === ctx.key && ctx.revision > reg.revision) this.registrationLost(event.worker_id, reg);
    } else if (event.type === 'reset' && ctx.snapshot) {
      const { keys, asked = -1 } = ctx.snapshot;
      for (const [workerId, reg] of this.registrations) {
        // Put confirmed before the list was asked for: it must be in it. Ordered locally, not by
        // revision, since an etcd restored from a backup answers with older revisions than ours.
        if (reg.seq <= asked && !keys.has(reg.key) && !this.deleting.has(reg.key)) this.registrationLost(workerId, reg);
      }
      // A reset follows every reconnect: etcd answers again, so old leases can go now (never rejects).
      void this.revokeLostLeases();
    }
  }

  private watchOwnKeys(): void {
    if (this.ownWatch || this.closed) return;
    const snapshot = async (): Promise<Snapshot> => {
      const asked = this.writeSeq;
      return { ...(await this.snapshot()), asked };
    };
    this.ownWatch = new PrefixWatch(this.client, snapshot, (e, ctx) => this.ownKeysEvent(e, ctx), () => undefined);
    this.ownWatch.begin();
  }

  async register(record: AnyRecord): Promise<void> {
    this.assertOpen();
    const key = etcdKey(record);
    let lease: Lease;
    let revision: bigint;
    for (let attempt = 1; ; attempt++) {
      lease = this.currentLease();
      try {
        revision = BigInt((await lease.put(key).value(JSON.stringify(record)).exec()).header.revision);
      } catch (err) {
        // The lease died (revoked, expired) before we learnt it: once more on a fresh one.
        if (err instanceof EtcdLeaseInvalidError && attempt === 1) continue;
        throw this.fail(`register ${record.worker_id}`, err);
      }
      if (!lease.revoked()) break;
      // Lost while the put was in flight: nobody would be told about this registration.
      if (attempt > 1) throw this.fail(`register ${record.worker_id}`, new Error('lease lost during registration, retry'));
    }
    const previous = this.registrations.get(record.worker_id);
    this.registrations.set(record.worker_id, { key, record: { ...record }, lease, revision, seq: ++this.writeSeq });
    this.watchOwnKeys();
    void this.revokeLostLeases(); // never rejects; the caller need not wait for old leases
    if (previous && previous.key !== key) {
      // Re-registered under another model: the old key would otherwise live as long as the lease.
      await this.deleteKey(previous.key, `remove old key of ${record.worker_id}`);
    }
  }

  /**
   * etcd answers again. Keys still on a lost lease belong to workers that chose not to come back
   * (draining, drained); without this they would reappear for one TTL after an etcd restart. A key
   * re-registered meanwhile has moved to a new lease and is safe. Never rejects: a lease that could
   * not be revoked stays in the set for the next chance, and expires on its own at worst.
   */
  private revokeLostLeases(): Promise<void> {
    for (const old of this.lostLeases) {
      if (this.revoking.has(old)) continue;
      const attempt = old
        .revoke()
        .then(
          () => void this.lostLeases.delete(old),
          () => undefined,
        )
        .finally(() => this.revoking.delete(old));
      this.revoking.set(old, attempt);
    }
    return Promise.all(this.revoking.values()).then(() => undefined);
  }

  /**
   * Safe to retry: a key already gone counts as removed. A failure throws and forgets nothing, so
   * a later loss of the lease is still reported for this worker.
   */
  async unregister(workerId: string): Promise<void> {
    this.assertOpen();
    const reg = this.registrations.get(workerId);
    if (reg) {
      // The lease stays: other records of this process are bound to it.
      await this.deleteKey(reg.key, `unregister ${workerId}`);
      if (this.registrations.get(workerId) === reg) this.registrations.delete(workerId);
    } else {
      // Not ours (lost already, or registered before a restart of this process): find it by id, like the other backends.
      let keys: string[];
      try {
        keys = await this.client.getAll().prefix(ETCD_PREFIX).keys();
      } catch (err) {
        throw this.fail(`unregister ${workerId}`, err);
      }
      for (const key of keys) if (workerIdFromKey(key) === workerId) await this.deleteKey(key, `unregister ${workerId}`);
    }
    await this.revokeLostLeases();
  }

  private async deleteKey(key: string, action: string): Promise<void> {
    const mine = this.deleting.get(key) ?? { calls: 0, seen: false };
    mine.calls++;
    this.deleting.set(key, mine);
    try {
      await this.client.delete().key(key).exec();
    } catch (err) {
      // The reply was lost but the watch saw the key go: done is done.
      if (!mine.seen) throw this.fail(action, err);
    } finally {
      if (--mine.calls === 0) this.deleting.delete(key);
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
    const records = res.kvs.map(parseRecord).filter((r): r is AnyRecord => r !== undefined);
    return { revision: res.header.revision, records, keys: new Set(res.kvs.map((kv) => kv.key.toString('utf8'))) };
  }

  async list(): Promise<WorkerRecord[]> {
    this.assertOpen();
    return (await this.snapshot()).records.filter((r): r is WorkerRecord => !isLoading(r));
  }

  async watch(listener: (event: DiscoveryEvent) => void): Promise<DiscoveryWatch> {
    return this.watchAll(servingOnly(listener));
  }

  async watchAll(listener: (event: FleetEvent) => void): Promise<DiscoveryWatch> {
    this.assertOpen();
    const watch = new PrefixWatch(this.client, () => this.snapshot(), (e) => listener(e), (w) => this.watches.delete(w));
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
    await this.routeMarks.close();
    await Promise.all([...this.watches, ...(this.ownWatch ? [this.ownWatch] : [])].map((w) => w.close()));
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
