import type { ToolCallSyntax } from '../../protocol/tools.js';
import { CAPABILITIES, missingCapability, type Capability } from '../../protocol/capabilities.js';
import type { FleetEvent, LoadingRecord, WorkerMode, WorkerRecord } from '../../discovery/discovery.js';
import { LeastLoaded, type Ranked } from './least-loaded.js';
import { canServeAdapter } from './adapter-view.js';

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
 * How long a worker that refused a flex request (no free slot beyond its priority reserve) gets only
 * the flex requests its status says it has room for (flex_room, free_slots); then it is tried again.
 */
export const FLEX_HOLD_MS = 5_000;

/**
 * How long a model stays known after its last worker left discovery: requests for it get a
 * retryable 503 no_serving_worker (its workers are drained or restarting), not a 404 that SDKs
 * never retry. A model nobody has served for this long is gone.
 */
export const MODEL_MEMORY_MS = 10 * 60_000;

/** A skip set with nothing in it, for the pool's calls that take one: shared, never written. */
export const NOTHING_SKIPPED: ReadonlySet<string> = new Set();

export interface PoolWorker {
  readonly record: WorkerRecord;
  /**
   * Requests this frontend currently has on the worker. Belongs to the requests, not to the
   * registration: it survives the worker leaving discovery and coming back (drain then resume).
   */
  inflight: number;
  /**
   * What routing ranks by: `inflight` plus what the other processes serving the same port report
   * on the worker (`ebb frontend --processes N`; see setPeerInflight). Equals `inflight` in one process.
   */
  readonly load: number;
  readonly hold?: { kind: Hold; until: number } | undefined;
  /** When it was last picked (a pool-wide counter): the round-robin order. */
  readonly pickedAt: number;
}

/** Told every change of this process's in-flight count on a worker (the cluster child reports them to its peers). */
export type InflightListener = (workerId: string, inflight: number) => void;

const YES_NO: readonly Capability[] = CAPABILITIES; // every one counted per model, so declares() is O(1)

/** A worker as the pool keeps it: its in-flight count re-ranks it in its (model, mode) index on every change. */
class Member implements PoolWorker, Ranked {
  #inflight = 0;
  #peers = 0;
  pickedAt = 0;
  slot = -1;
  hold: { kind: Hold; until: number } | undefined;
  /** Until when it gets no flex request (it refused one: its free slots are its priority reserve). */
  flexHeldUntil = 0;
  /** While flex-held: the flex requests its status last said it would take (one each). */
  flexCredits = 0;
  /** The pool's room mark when it last had room (a request on it ended, it said so, it registered): refusals sent before it are old news. */
  roomAt = 0;
  /** The index it is ranked in while in discovery; undefined once departed. */
  index: LeastLoaded<Member> | undefined;

  constructor(
    public record: WorkerRecord,
    private readonly listener: InflightListener | undefined,
  ) {}

  get inflight(): number {
    return this.#inflight;
  }

  set inflight(n: number) {
    this.#inflight = n;
    this.index?.update(this);
    this.listener?.(this.record.worker_id, n);
  }

  get load(): number {
    return this.#inflight + this.#peers;
  }

  set peers(n: number) {
    this.#peers = n;
    this.index?.update(this);
  }
}

/** Per model: how many workers of each mode, and how many (non-prefill) declare each capability. */
interface ModelCounts {
  workers: number;
  modes: Map<WorkerMode, number>;
  declaring: Map<Capability, number>;
}

const keyOf = (model: string, mode: WorkerMode) => `${mode}\u0000${model}`;

/**
 * The frontend's view of the fleet, fed by discovery events; no state of its own beyond local holds
 * and in-flight counts. Routing is least in-flight with a round-robin tie-break: long streams make
 * per-request round robin uneven, and in-flight is the load signal a frontend has for free; among
 * equally loaded workers the one picked longest ago goes first, so an idle fleet is used evenly.
 * Workers are indexed per (model, mode) in a heap kept up to date on acquire/release and discovery
 * events, so a routing decision is O(log n) in the fleet and copies nothing.
 */
export class WorkerPool {
  private readonly workers = new Map<string, Member>();
  /** Workers gone from discovery that still have requests from this frontend open; never routed to. */
  private readonly departed = new Map<string, Member>();
  private readonly indexes = new Map<string, LeastLoaded<Member>>();
  private readonly counts = new Map<string, ModelCounts>();
  private picks = 0;
  /** Room events so far (see Member.roomAt). */
  private rooms = 0;
  /** When the last worker of each model left discovery (see MODEL_MEMORY_MS). */
  private readonly lastServed = new Map<string, number>();
  /** Peer processes' in-flight counts by worker id, kept for workers this view does not hold yet. */
  private readonly peerInflight = new Map<string, number>();
  /** Per LoRA adapter: its base models, with how many workers in discovery can load it on each. */
  private readonly adapterBases = new Map<string, Map<string, number>>();
  /** When the last worker that could load each adapter left discovery (as lastServed for models). */
  private readonly adapterLastServed = new Map<string, { base: string; at: number }>();
  /** Workers registered as loading (their engine loads): never routed to; their model's requests wait for them. */
  private readonly loading = new Map<string, LoadingRecord>();

  /**
   * Told that `model`'s workers may take more now: one (re-)registered, a request on one ended, one
   * said it has room again. The admission queue gives turns on it; unset, nothing is called.
   */
  onRoom: ((model: string) => void) | undefined;
  /** Told when a worker refused for being full or draining (the saturation watch then follows its own word on it). */
  onRefused: ((record: WorkerRecord) => void) | undefined;

  /**
   * `onInflight`: told each change of this process's own in-flight counts (to share them with peer processes).
   * `own`: the worker whose --openai-port this pool routes for (read live: its adapters change): its
   * model and adapters stay known while it is out of discovery (drained, or started drained), a 503, never a 404.
   */
  constructor(
    private readonly onInflight?: InflightListener,
    private readonly own?: WorkerRecord,
  ) {}

  /** What the other processes serving this port have open on `workerId` (their sum); it ranks the worker here too. */
  setPeerInflight(workerId: string, n: number): void {
    if (n === 0) this.peerInflight.delete(workerId);
    else this.peerInflight.set(workerId, n);
    const w = this.workers.get(workerId) ?? this.departed.get(workerId);
    if (w) w.peers = n;
  }

  apply(event: FleetEvent): void {
    if (event.type === 'reset') {
      const next = new Map(event.records.map((r) => [r.worker_id, r]));
      for (const id of [...this.workers.keys()]) if (!next.has(id)) this.remove(id);
      const loading = event.loading ?? [];
      const stillLoading = new Set(loading.map((r) => r.worker_id));
      for (const id of [...this.loading.keys()]) if (!stillLoading.has(id) && !next.has(id)) this.loaded(id);
      for (const r of loading) this.startsLoading(r);
      for (const r of next.values()) this.put(r);
    } else if (event.type === 'put') this.put(event.record);
    else if (event.type === 'loading') this.startsLoading(event.record);
    else {
      this.remove(event.worker_id);
      this.loaded(event.worker_id);
    }
  }

  /** `record`'s worker loads its engine (a restart under its id leaves the routing first). */
  private startsLoading(record: LoadingRecord): void {
    this.remove(record.worker_id);
    this.loading.set(record.worker_id, record);
    this.lastServed.delete(record.model);
  }

  /** It left while loading (its record went, or a reset no longer lists it): it never came up. */
  private loaded(workerId: string): void {
    const r = this.loading.get(workerId);
    if (r === undefined) return;
    this.loading.delete(workerId);
    // One that never came up leaves its model known for a while, as a drained one does: a 503, not a 404.
    if (!this.knows(r.model)) this.lastServed.set(r.model, Date.now());
  }

  /** The loading record of `workerId`, while it loads. */
  loadingRecord(workerId: string): LoadingRecord | undefined {
    return this.loading.get(workerId);
  }

  /**
   * Does `model` have a worker loading that would serve its requests (aggregated or decode; a
   * prefill worker alone generates nothing), other than those in `skip`?
   */
  loadingFor(model: string, skip: ReadonlySet<string> = NOTHING_SKIPPED): boolean {
    for (const r of this.loading.values()) if (r.model === model && r.mode !== 'prefill' && !skip.has(r.worker_id)) return true;
    return false;
  }

  private count(record: WorkerRecord, by: 1 | -1): void {
    let c = this.counts.get(record.model);
    if (!c) this.counts.set(record.model, (c = { workers: 0, modes: new Map(), declaring: new Map() }));
    c.workers += by;
    c.modes.set(record.mode, (c.modes.get(record.mode) ?? 0) + by);
    if (record.mode !== 'prefill') for (const cap of YES_NO) if (record.capabilities?.[cap] === true) c.declaring.set(cap, (c.declaring.get(cap) ?? 0) + by);
    if (c.workers === 0) this.counts.delete(record.model);
    if (record.adapters !== undefined) for (const name of record.adapters.available) this.countAdapter(name, record.model, by);
  }

  private countAdapter(name: string, base: string, by: 1 | -1): void {
    let bases = this.adapterBases.get(name);
    if (!bases) this.adapterBases.set(name, (bases = new Map()));
    const n = (bases.get(base) ?? 0) + by;
    if (n > 0) bases.set(base, n);
    else bases.delete(base);
    if (bases.size > 0) {
      this.adapterLastServed.delete(name);
      return;
    }
    this.adapterBases.delete(name);
    this.adapterLastServed.set(name, { base, at: Date.now() });
  }

  /**
   * The base model a LoRA adapter named as a request's `model` runs on: one a worker in discovery
   * can load it on, or (its workers all drained lately) the one it ran on, for a retryable 503.
   * Undefined: no such adapter (a model's name is never read as an adapter's).
   */
  adapterBase(name: string, now = Date.now()): { base: string; inDiscovery: boolean } | undefined {
    const bases = this.adapterBases.get(name);
    if (bases !== undefined) for (const base of bases.keys()) return { base, inDiscovery: true };
    if (this.own?.adapters?.available.includes(name)) return { base: this.own.model, inDiscovery: false };
    const left = this.adapterLastServed.get(name);
    return left !== undefined && now - left.at < MODEL_MEMORY_MS ? { base: left.base, inDiscovery: false } : undefined;
  }

  /** Every adapter known (in discovery, or lately), with its base model: what /v1/models lists. */
  knownAdapters(now = Date.now()): Array<{ name: string; base: string; available: boolean }> {
    const out = [...this.adapterBases].map(([name, bases]) => ({ name, base: [...bases.keys()][0]!, available: true }));
    for (const [name, left] of this.adapterLastServed) if (now - left.at < MODEL_MEMORY_MS) out.push({ name, base: left.base, available: false });
    for (const name of this.own?.adapters?.available ?? []) if (!out.some((a) => a.name === name)) out.push({ name, base: this.own!.model, available: false });
    return out.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  }

  /** Enters `w` (in discovery with `w.record`) into its counts and its index. */
  private enter(w: Member): void {
    this.count(w.record, 1);
    const key = keyOf(w.record.model, w.record.mode);
    let index = this.indexes.get(key);
    if (!index) this.indexes.set(key, (index = new LeastLoaded<Member>()));
    w.index = index;
    index.add(w);
  }

  private leave(w: Member): void {
    this.count(w.record, -1);
    const index = w.index;
    w.index = undefined;
    if (!index) return;
    index.delete(w);
    if (index.size === 0) this.indexes.delete(keyOf(w.record.model, w.record.mode));
  }

  private remove(workerId: string): void {
    const w = this.workers.get(workerId);
    if (!w) return;
    this.workers.delete(workerId);
    this.leave(w);
    if (w.inflight > 0) this.departed.set(workerId, w);
    if (!this.hasModel(w.record.model)) this.lastServed.set(w.record.model, Date.now());
  }

  private put(record: WorkerRecord): void {
    this.loading.delete(record.worker_id);
    // The same object comes back, so its open requests still count, and still decrement it.
    const existing = this.workers.get(record.worker_id) ?? this.departed.get(record.worker_id);
    this.departed.delete(record.worker_id);
    if (existing) {
      if (existing.index) this.leave(existing);
      existing.record = record;
      existing.hold = undefined; // a (re-)registration is the worker saying it serves: any local hold ends
      existing.flexHeldUntil = 0;
      existing.flexCredits = 0;
      existing.roomAt = ++this.rooms;
      this.workers.set(record.worker_id, existing);
      this.enter(existing);
    } else {
      const w = new Member(record, this.onInflight);
      w.peers = this.peerInflight.get(record.worker_id) ?? 0;
      this.workers.set(record.worker_id, w);
      this.enter(w);
    }
    this.lastServed.delete(record.model);
    this.onRoom?.(record.model);
  }

  /**
   * Counts a request this frontend opens on `worker`; the returned function (idempotent) ends it.
   * A `flex` one spends one of the flex requests a flex-held worker said it would take. Ended
   * `served` (the default: the worker took it, and its slot is free now), it is room on the worker:
   * an overload hold ends and the queue is told. An attempt the worker refused, or a reservation,
   * ends unserved: nothing freed there, and the queue is not woken by its own tries.
   */
  acquire(worker: PoolWorker, flex = false): (served?: boolean) => void {
    worker.inflight++;
    if (flex) this.spendFlexCredit(worker.record.worker_id);
    let released = false;
    return (served = true) => {
      if (released) return;
      released = true;
      worker.inflight--;
      if (worker.inflight === 0 && this.departed.get(worker.record.worker_id) === worker) this.departed.delete(worker.record.worker_id);
      // Without a queue nothing waits for room. A prefill worker's slot is not what a queued request
      // waits for (decode or aggregated workers are).
      if (!served || worker.record.mode === 'prefill' || this.onRoom === undefined) return;
      const w = this.workers.get(worker.record.worker_id);
      if (w === undefined) return;
      w.roomAt = ++this.rooms;
      // A slot it refused for freed: an overload hold is over (a drain's is not).
      if (w.hold?.kind === 'overloaded') w.hold = undefined;
      this.onRoom(worker.record.model);
    };
  }

  /** The room mark now: an attempt notes it when sent, and its refusal holds the worker only if it had no room since (see hold). */
  get roomMark(): number {
    return this.rooms;
  }

  /**
   * The worker's own word that it takes requests again (its status: admission open, not full): its
   * overload or drain hold ends, a refusal sent before it is old news, and queued requests get their turn.
   */
  roomAgain(workerId: string): void {
    const w = this.workers.get(workerId);
    if (w === undefined) return;
    w.roomAt = ++this.rooms;
    if (w.hold !== undefined && w.hold.kind !== 'unreachable') w.hold = undefined;
    this.onRoom?.(w.record.model);
  }

  /**
   * The worker's own word that it is full (its status: overloaded): it is held out until it says it
   * has room (roomAgain), a request on it ends, or its word is lost (wordLost). Returns whether
   * that is news (it was not held so already).
   */
  holdFull(workerId: string): boolean {
    const w = this.workers.get(workerId);
    if (w === undefined || (w.hold?.kind === 'overloaded' && w.hold.until === Infinity)) return false;
    if (w.hold?.kind === 'draining' || w.hold?.kind === 'unreachable') return false;
    w.hold = { kind: 'overloaded', until: Infinity };
    return true;
  }

  /** Its status stream broke: a hold on its word alone ends as a refusal's would. */
  wordLost(workerId: string, now = Date.now()): void {
    const w = this.workers.get(workerId);
    if (w?.hold?.kind === 'overloaded' && w.hold.until === Infinity) w.hold = { kind: 'overloaded', until: now + HOLD_MS.overloaded };
  }

  /**
   * `workerId` refused a flex request: for FLEX_HOLD_MS only what it says it has room for (flexRoom)
   * goes to it. `sentAt`: the room mark when the refused attempt was sent (a refusal the worker's
   * room has overtaken holds nothing).
   */
  holdFlex(workerId: string, now = Date.now(), sentAt?: number): void {
    const w = this.workers.get(workerId);
    if (!w || (sentAt !== undefined && w.roomAt > sentAt)) return;
    w.flexHeldUntil = now + FLEX_HOLD_MS;
    w.flexCredits = 0;
    this.onRefused?.(w.record);
  }

  private spendFlexCredit(workerId: string): void {
    const w = this.workers.get(workerId);
    if (w !== undefined && w.flexCredits > 0) w.flexCredits--;
  }

  /**
   * The worker's own word on how many flex requests it would admit now (its free slots beyond its
   * reserve): while it is flex-held, that many queued flex requests may go to it, one each, so a
   * freed slot is not met by every waiter at once.
   */
  flexRoom(workerId: string, room: number): void {
    const w = this.workers.get(workerId);
    if (w === undefined || w.flexHeldUntil === 0) return;
    w.flexCredits = room;
    if (room > 0) this.onRoom?.(w.record.model);
  }

  /** Adds to `skip` the workers of `model` in `mode` that take no flex request now (a flex request's route skips them). */
  skipFlexHeld(model: string, mode: WorkerMode, skip: Set<string>, now = Date.now()): void {
    const index = this.indexes.get(keyOf(model, mode));
    if (index) for (const w of index.values()) if (w.flexHeldUntil > now && w.flexCredits === 0) skip.add(w.record.worker_id);
  }

  /** Workers of `model` a new request may be sent to now: in discovery on its serving path, not held. */
  routable(model: string, now = Date.now()): number {
    const index = this.indexes.get(keyOf(model, this.servingPath(model) === 'aggregated' ? 'aggregated' : 'decode'));
    let n = 0;
    if (index) for (const w of index.values()) if (!(w.hold !== undefined && w.hold.until > now)) n++;
    return n;
  }

  /**
   * Seconds until the frontend tries a held worker of `model` again (the earliest hold's end: a
   * drain's, an overload's, an unreachable one's); undefined when none is held, as nothing is known then.
   */
  retryAfterS(model: string, now = Date.now()): number | undefined {
    let until: number | undefined;
    for (const mode of ['aggregated', 'decode'] as const) {
      const index = this.indexes.get(keyOf(model, mode));
      // A hold on the worker's word alone (until it says it has room) says nothing of when.
      if (index) for (const w of index.values()) if (w.hold !== undefined && w.hold.until > now && w.hold.until !== Infinity && (until === undefined || w.hold.until < until)) until = w.hold.until;
    }
    return until === undefined ? undefined : Math.max(1, Math.ceil((until - now) / 1000));
  }

  /**
   * Does `model` have a worker in discovery, on its serving path, that may take a request soon:
   * routable, or held for draining or for being full? One that stopped answering (unreachable) is not
   * counted, nor those in `skip` (the worker a continuation leaves).
   */
  mayServeSoon(model: string, skip: ReadonlySet<string>, now = Date.now()): boolean {
    const index = this.indexes.get(keyOf(model, this.servingPath(model) === 'aggregated' ? 'aggregated' : 'decode'));
    if (index) for (const w of index.values()) if (!skip.has(w.record.worker_id) && !(w.hold?.kind === 'unreachable' && w.hold.until > now)) return true;
    return false;
  }

  /** In-flight counts by worker id, including departed workers that still have requests open. */
  inflight(): Map<string, number> {
    const out = new Map<string, number>();
    for (const w of this.departed.values()) out.set(w.record.worker_id, w.inflight);
    for (const w of this.workers.values()) out.set(w.record.worker_id, w.inflight);
    return out;
  }

  /**
   * `forS`: the worker's own word on how long (a draining worker's ETA), for a drain hold. `sentAt`:
   * the room mark when the refused attempt was sent: a worker that had room since (a request on it
   * ended, it said so) is not held for being full or draining, its refusal is old news.
   */
  hold(workerId: string, kind: Hold, now = Date.now(), forS?: number, sentAt?: number): void {
    const w = this.workers.get(workerId);
    if (!w) return;
    if (kind !== 'unreachable' && sentAt !== undefined && w.roomAt > sentAt) return;
    // The worker's word that it is full holds it already, for as long as it says so.
    if (!(kind === 'overloaded' && w.hold?.kind === 'overloaded' && w.hold.until === Infinity))
      w.hold = { kind, until: now + (kind === 'draining' && forS !== undefined ? forS * 1000 : HOLD_MS[kind]) };
    if (kind !== 'unreachable') this.onRefused?.(w.record);
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
    const c = this.counts.get(model);
    if (!c) return false;
    return mode === undefined ? c.workers > 0 : (c.modes.get(mode) ?? 0) > 0;
  }

  /** Does some worker of `model` in discovery declare `capability`? (Its state does not matter: that is routing's business.) */
  declares(model: string, capability: Capability): boolean {
    return (this.counts.get(model)?.declaring.get(capability) ?? 0) > 0;
  }

  /**
   * How the workers of `model` that call tools write a call (their declared tool_syntax): the first
   * found; a model's workers run one model, so they agree. Undefined: none declares tools.
   */
  toolSyntax(model: string): ToolCallSyntax | undefined {
    for (const w of this.workers.values()) {
      const c = w.record.capabilities;
      if (w.record.model === model && c?.tools === true && c.tool_syntax) return c.tool_syntax;
    }
    return undefined;
  }

  /** The engine kinds serving `model`, for error messages. */
  engineKinds(model: string): string[] {
    const kinds = new Set<string>();
    for (const w of this.workers.values()) if (w.record.model === model) kinds.add(w.record.engine ?? 'unknown');
    return [...kinds].sort();
  }

  /**
   * Aggregated workers when there are any; prefill+decode pairs otherwise, also when no prefill
   * worker is left in discovery (drained, gone): decode workers then evaluate the prompt themselves.
   */
  servingPath(model: string): 'aggregated' | 'disaggregated' {
    return !this.hasModel(model, 'aggregated') && (this.hasModel(model, 'prefill') || this.hasModel(model, 'decode')) ? 'disaggregated' : 'aggregated';
  }

  /** Models with at least one worker in discovery, whatever its state: a draining model is still a model. */
  models(): string[] {
    return [...this.counts.keys()].sort();
  }

  /** Every model `knows`: those in discovery and those whose last worker left it lately. */
  knownModels(now = Date.now()): string[] {
    const known = new Set(this.counts.keys());
    for (const r of this.loading.values()) known.add(r.model);
    for (const [model, left] of this.lastServed) if (now - left < MODEL_MEMORY_MS) known.add(model);
    if (this.own !== undefined) known.add(this.own.model);
    return [...known].sort();
  }

  /** A model in discovery (loading included), or one whose last worker left it less than MODEL_MEMORY_MS ago. */
  knows(model: string, now = Date.now()): boolean {
    if (this.hasModel(model) || this.own?.model === model) return true;
    for (const r of this.loading.values()) if (r.model === model) return true;
    const left = this.lastServed.get(model);
    return left !== undefined && now - left < MODEL_MEMORY_MS;
  }

  /**
   * Every worker of `model` in `mode` that may take this request now (in discovery, not held, not
   * tried, declaring `needs`, able to take `adapter` where one is named): what a scoring router (routing/router.ts) chooses among. Eligibility
   * comes first, so nothing leaving is ever scored.
   */
  eligible(model: string, mode: WorkerMode, tried: ReadonlySet<string>, needs: readonly Capability[] = [], now = Date.now(), adapter?: string): PoolWorker[] {
    const index = this.indexes.get(keyOf(model, mode));
    if (!index) return [];
    const out: PoolWorker[] = [];
    for (const w of index.values()) {
      if (w.hold !== undefined && w.hold.until > now) continue;
      if (tried.size > 0 && tried.has(w.record.worker_id)) continue;
      if (needs.length > 0 && missingCapability(w.record.capabilities, needs) !== undefined) continue;
      if (adapter !== undefined && !canServeAdapter(w.record, adapter)) continue;
      out.push(w);
    }
    return out;
  }

  /** Records that a router chose `worker` (the least-loaded tie-break and round-robin rotate on it). */
  picked(worker: PoolWorker): void {
    const w = this.workers.get(worker.record.worker_id);
    if (w !== worker || !w.index) return;
    w.pickedAt = ++this.picks;
    w.index.update(w);
  }

  /**
   * The least-loaded eligible worker of `model` in `mode` that declares every capability in `needs`,
   * skipping those already tried for this request and those held out.
   */
  pick(model: string, mode: WorkerMode, tried: ReadonlySet<string>, needs: readonly Capability[] = [], now = Date.now(), adapter?: string): PoolWorker | undefined {
    const index = this.indexes.get(keyOf(model, mode));
    if (!index) return undefined;
    const w = index.best(
      (w) =>
        !(w.hold !== undefined && w.hold.until > now) &&
        !(tried.size > 0 && tried.has(w.record.worker_id)) &&
        !(needs.length > 0 && missingCapability(w.record.capabilities, needs) !== undefined) &&
        !(adapter !== undefined && !canServeAdapter(w.record, adapter)),
    );
    if (!w) return undefined;
    w.pickedAt = ++this.picks; // to the back of its in-flight level: ties rotate
    index.update(w);
    return w;
  }
}
