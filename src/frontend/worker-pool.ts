import { missingCapability, type Capability } from '../protocol/capabilities.js';
import type { DiscoveryEvent, WorkerMode, WorkerRecord } from '../discovery/discovery.js';

/** Why the frontend is not sending a worker new requests for now, though discovery still lists it. */
export type Hold = 'draining' | 'overloaded' | 'unreachable';

/** How long each kind of hold lasts unless discovery says otherwise first. */
export const HOLD_MS: Record<Hold, number> = {
  // Draining workers leave discovery soon after refusing; re-trying one after a while costs one 503.
  draining: 10_000,
  overloaded: 250,
  unreachable: 5_000,
};

/**
 * How long a model stays known after its last worker left discovery: requests for it get a
 * retryable 503 no_serving_worker (its workers are drained or restarting), not a 404 that SDKs
 * never retry. A model nobody has served for this long is gone.
 */
export const MODEL_MEMORY_MS = 10 * 60_000;

export interface PoolWorker {
  record: WorkerRecord;
  /**
   * Requests this frontend currently has on the worker. Belongs to the requests, not to the
   * registration: it survives the worker leaving discovery and coming back (drain then resume).
   */
  inflight: number;
  hold?: { kind: Hold; until: number } | undefined;
}

/**
 * The frontend's view of the fleet, fed by discovery events; no state of its own beyond local holds
 * and in-flight counts. Routing is least in-flight with a round-robin tie-break: long streams make
 * per-request round robin uneven, and in-flight is the load signal a frontend has for free; the
 * rotating start spreads ties so an idle fleet is used evenly.
 */
export class WorkerPool {
  private readonly workers = new Map<string, PoolWorker>();
  /** Workers gone from discovery that still have requests from this frontend open; never routed to. */
  private readonly departed = new Map<string, PoolWorker>();
  private cursor = 0;
  /** When the last worker of each model left discovery (see MODEL_MEMORY_MS). */
  private readonly lastServed = new Map<string, number>();

  apply(event: DiscoveryEvent): void {
    if (event.type === 'reset') {
      const next = new Map(event.records.map((r) => [r.worker_id, r]));
      for (const id of [...this.workers.keys()]) if (!next.has(id)) this.remove(id);
      for (const r of next.values()) this.put(r);
    } else if (event.type === 'put') this.put(event.record);
    else this.remove(event.worker_id);
  }

  private remove(workerId: string): void {
    const w = this.workers.get(workerId);
    if (!w) return;
    this.workers.delete(workerId);
    if (w.inflight > 0) this.departed.set(workerId, w);
    if (!this.hasModel(w.record.model)) this.lastServed.set(w.record.model, Date.now());
  }

  private put(record: WorkerRecord): void {
    // The same object comes back, so its open requests still count, and still decrement it.
    const existing = this.workers.get(record.worker_id) ?? this.departed.get(record.worker_id);
    this.departed.delete(record.worker_id);
    // A (re-)registration is the worker saying it serves: any local hold ends.
    if (existing) {
      existing.record = record;
      existing.hold = undefined;
      this.workers.set(record.worker_id, existing);
    } else this.workers.set(record.worker_id, { record, inflight: 0 });
    this.lastServed.delete(record.model);
  }

  /** Counts a request this frontend opens on `worker`; the returned function (idempotent) ends it. */
  acquire(worker: PoolWorker): () => void {
    worker.inflight++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      worker.inflight--;
      if (worker.inflight === 0 && this.departed.get(worker.record.worker_id) === worker) this.departed.delete(worker.record.worker_id);
    };
  }

  /** In-flight counts by worker id, including departed workers that still have requests open. */
  inflight(): Map<string, number> {
    const out = new Map<string, number>();
    for (const w of this.departed.values()) out.set(w.record.worker_id, w.inflight);
    for (const w of this.workers.values()) out.set(w.record.worker_id, w.inflight);
    return out;
  }

  hold(workerId: string, kind: Hold, now = Date.now()): void {
    const w = this.workers.get(workerId);
    if (w) w.hold = { kind, until: now + HOLD_MS[kind] };
  }

  get size(): number {
    return this.workers.size;
  }

  all(): PoolWorker[] {
    return [...this.workers.values()];
  }

  get(workerId: string): PoolWorker | undefined {
    return this.workers.get(workerId);
  }

  hasModel(model: string, mode?: WorkerMode): boolean {
    for (const w of this.workers.values()) if (w.record.model === model && (mode === undefined || w.record.mode === mode)) return true;
    return false;
  }

  /** Does some worker of `model` in discovery declare `capability`? (Its state does not matter: that is routing's business.) */
  declares(model: string, capability: Capability): boolean {
    for (const w of this.workers.values()) if (w.record.model === model && w.record.mode !== 'prefill' && w.record.capabilities?.[capability] === true) return true;
    return false;
  }

  /** The engine kinds serving `model`, for error messages. */
  engineKinds(model: string): string[] {
    const kinds = new Set<string>();
    for (const w of this.workers.values()) if (w.record.model === model) kinds.add(w.record.engine ?? 'unknown');
    return [...kinds].sort();
  }

  /** Aggregated workers when there are any; prefill+decode pairs otherwise. */
  servingPath(model: string): 'aggregated' | 'disaggregated' {
    return !this.hasModel(model, 'aggregated') && this.hasModel(model, 'prefill') ? 'disaggregated' : 'aggregated';
  }

  /** Models with at least one worker in discovery, whatever its state: a draining model is still a model. */
  models(): string[] {
    const names = new Set<string>();
    for (const w of this.workers.values()) names.add(w.record.model);
    return [...names].sort();
  }

  /** A model in discovery, or one whose last worker left it less than MODEL_MEMORY_MS ago. */
  knows(model: string, now = Date.now()): boolean {
    if (this.hasModel(model)) return true;
    const left = this.lastServed.get(model);
    return left !== undefined && now - left < MODEL_MEMORY_MS;
  }

  /**
   * The least-loaded eligible worker of `model` in `mode` that declares every capability in `needs`,
   * skipping those already tried for this request.
   */
  pick(model: string, mode: WorkerMode, tried: ReadonlySet<string>, needs: readonly Capability[] = [], now = Date.now()): PoolWorker | undefined {
    const all = [...this.workers.values()];
    const n = all.length;
    if (n === 0) return undefined;
    const start = this.cursor++ % n;
    let best: PoolWorker | undefined;
    for (let i = 0; i < n; i++) {
      const w = all[(start + i) % n] as PoolWorker;
      if (w.record.model !== model || w.record.mode !== mode || tried.has(w.record.worker_id)) continue;
      if (w.hold && w.hold.until > now) continue;
      if (needs.length > 0 && missingCapability(w.record.capabilities, needs) !== undefined) continue;
      if (!best || w.inflight < best.inflight) best = w;
    }
    return best;
  }
}
