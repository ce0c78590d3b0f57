import { EventEmitter } from 'node:events';
import type { Logger } from 'pino';
import type { AdapterSource, EngineAdapters } from '../engine/engine-adapters.js';
import { nextAdapterState, SLOT_STATES, type AdapterEvent, type AdapterState } from '../lifecycle/adapter-states.js';
import type { AdapterRecord, AdapterStatus, ResidentState } from '../protocol/adapters.js';
import { EbbError } from '../protocol/errors.js';
import type { AdapterPolicy } from './adapter-policy.js';
import { ATTR } from '../tracing/attributes.js';
import { workerSpan, type WorkerTrace } from '../tracing/worker-trace.js';

/** What the record says a load takes before this worker has timed one. */
export const DEFAULT_ADAPTER_LOAD_MS = 1000;

/**
 * A request's claim on its adapter, from its admission to the end of its scope: counted in the
 * adapter's in-flight until `release` (idempotent, called by the scope's close whichever way the
 * request ends). `ready` settles once the adapter applies (at once when it is serving), or rejects
 * with a retryable EbbError when its load failed or a drain aborted it.
 */
export interface AdapterHold {
  readonly name: string;
  readonly ready: Promise<void>;
  release(): void;
}

export type AdapterRefusal = 'adapter_draining' | 'adapter_slots_busy';

/**
 * The engine's unload of a draining adapter: not started (requests in flight), under way, or failed.
 * A failed one keeps its slot (fail closed: the engine may still hold it) until a retry succeeds:
 * the next load that needs a slot, a request or load for the adapter itself, an admin drain or
 * unload, a worker drain or resume.
 */
type UnloadState = 'none' | 'running' | 'failed';

interface Entry {
  /** Where the engine reads it: an admin load may name another path for an adapter that is not resident. */
  source: AdapterSource;
  state: AdapterState;
  since: Date;
  inflight: number;
  loads: number;
  lastUsed: number;
  lastUsedAt: Date | null;
  /** The engine holds it (a load resolved, no unload since). */
  resident: boolean;
  /** While loading, and until the engine's load settles after a drain aborted it. */
  load: { abort: AbortController; settled: Promise<void> } | undefined;
  /** What holds wait on: resolved when serving, rejected when the load ends any other way. */
  ready: Promise<void>;
  settle: ((err?: EbbError) => void) | undefined;
  unload: UnloadState;
  lastError: string | null;
  /** Told when it reaches unloaded, or (with why) when its unload failed. */
  readonly unloadWaiters: Set<(failed?: Error) => void>;
}

const RESOLVED = Promise.resolve();

/**
 * The worker's side of its engine's LoRA adapters: each one's state (lifecycle/adapter-states.ts),
 * its in-flight count, which to evict (the least recently used idle one), and when to unload (a
 * drain's in-flight reaching 0, counted). The engine only loads, unloads and applies. Emits
 * `change` on every state move (the discovery record and status streams follow it) and `inflight`
 * on every admission or release, and `load` (the adapter's name) as each load starts.
 */
export class WorkerAdapters extends EventEmitter {
  private readonly entries = new Map<string, Entry>();
  private loadMs: number | undefined;

  constructor(
    private readonly engine: EngineAdapters,
    private readonly log: Logger,
    /** What an admin load may read (adapter-policy.ts). */
    private readonly policy: AdapterPolicy,
  ) {
    super();
    for (const source of engine.available()) this.add(source);
  }

  get slots(): number {
    return this.engine.maxResident;
  }

  /**
   * The one admission point for an adapter's requests: synchronous, so a drain that closes it and
   * the count it waits on can never disagree. Throws adapter_not_found for a name it cannot load.
   */
  admit(name: string, cause?: WorkerTrace): AdapterHold | { refused: AdapterRefusal } {
    const e = this.entry(name);
    if (e.state === 'draining') {
      this.retryUnload(e);
      return { refused: 'adapter_draining' };
    }
    if (e.state === 'unloaded' && !this.startLoad(e, cause)) return { refused: 'adapter_slots_busy' };
    e.inflight++;
    this.touch(e);
    this.emit('inflight');
    let released = false;
    return {
      name,
      ready: e.state === 'serving' ? RESOLVED : e.ready,
      release: () => {
        if (released) return;
        released = true;
        e.inflight--;
        this.touch(e);
        this.emit('inflight');
        if (e.state === 'draining') void this.unloadWhenIdle(e);
      },
    };
  }

  /** At start: what the engine says it holds already is serving (and available, if it was not named). */
  async adoptResident(): Promise<void> {
    let names: string[];
    try {
      names = await this.engine.resident();
    } catch (err) {
      this.log.warn({ event: 'adapter_resident_unknown', err: (err as Error).message }, `cannot read which adapters the engine holds: ${(err as Error).message}`);
      return;
    }
    for (const name of names) {
      const e = this.entries.get(name) ?? this.add({ name });
      if (e.state !== 'unloaded') continue;
      e.resident = true;
      this.move(e, 'found', 'resident in the engine at start');
    }
  }

  /** POST /engine/adapters/{name}/load: resident once it resolves (a new source joins those available). */
  async load(source: AdapterSource): Promise<AdapterStatus> {
    await this.policy.check(source, this.entries.get(source.name)?.source);
    const known = this.entries.get(source.name);
    const e = known ?? this.add(source);
    const previous = e.source;
    if (e.state === 'unloaded' && source.path !== undefined) e.source = source;
    try {
      if (e.state === 'draining') {
        this.retryUnload(e);
        throw new EbbError('adapter_draining', `adapter "${source.name}" is draining; load it again once it is unloaded`, { headers: { 'retry-after': '1' } });
      }
      if (e.state === 'unloaded' && !this.startLoad(e))
        throw new EbbError('adapter_slots_busy', `all ${this.slots} adapter slots hold adapters with requests in flight; retry once one is idle`, { headers: { 'retry-after': '1' } });
      await e.ready;
    } catch (err) {
      // What did not load is not offered: a new name leaves the record (clients would be routed to
      // it, and fail, on every request), a known one keeps the path it had.
      if (e.state === 'unloaded' && known === undefined) {
        this.entries.delete(source.name);
        this.emit('change');
      } else if (e.state === 'unloaded') e.source = previous;
      throw err;
    }
    return this.statusOf(e);
  }

  /**
   * Admin drain (and unload, and a worker drain's): closes admission for it at once; the unload
   * follows once its in-flight reaches 0. Resolves with its status as it is then (`draining`, or
   * `unloaded` when nothing ran); `whenUnloaded` waits for the end.
   */
  drain(name: string, reason: string): AdapterStatus {
    const e = this.entry(name);
    const from = e.state;
    this.move(e, 'drain', reason);
    // Caught loading: the load is abandoned, and the requests waiting on it go elsewhere at once.
    if (from === 'loading') {
      e.load?.abort.abort(new Error('adapter drained while loading'));
      e.settle?.(new EbbError('adapter_draining', `adapter "${e.source.name}" was drained while it loaded; retry on another worker`));
    }
    void this.unloadWhenIdle(e);
    return this.statusOf(e);
  }

  /** Resolves once the adapter is unloaded (at once when it is); rejects when the engine's unload fails. */
  whenUnloaded(name: string): Promise<void> {
    const e = this.entry(name);
    if (e.state === 'unloaded') return RESOLVED;
    return new Promise((resolve, reject) => e.unloadWaiters.add((failed) => (failed ? reject(failed) : resolve())));
  }

  /** A worker drain drains every adapter with it (and retries the unloads that failed). */
  drainAll(reason: string): void {
    for (const e of this.entries.values()) if (e.state !== 'unloaded') this.drain(e.source.name, reason);
  }

  /** A worker resuming: the unloads that failed are tried again, so their slots come back once the engine lets go. */
  retryFailedUnloads(): void {
    for (const e of this.entries.values()) this.retryUnload(e);
  }

  status(): AdapterStatus[] {
    return [...this.entries.values()].map((e) => this.statusOf(e));
  }

  statusOf(e: Entry | string): AdapterStatus {
    const x = typeof e === 'string' ? this.entry(e) : e;
    const waiting = x.state !== 'draining' ? [] : x.inflight > 0 ? [`${x.inflight} in-flight request${x.inflight === 1 ? '' : 's'}`] : [x.unload === 'failed' && x.lastError !== null ? x.lastError : 'the engine unloading it'];
    return {
      name: x.source.name,
      state: x.state,
      inflight_requests: x.inflight,
      loads: x.loads,
      waiting_for: waiting,
      last_used: x.lastUsedAt?.toISOString() ?? null,
      state_since: x.since.toISOString(),
    };
  }

  /** What the discovery record says of them. */
  record(): AdapterRecord {
    const resident: Record<string, ResidentState> = {};
    for (const e of this.entries.values()) if (e.state !== 'unloaded') resident[e.source.name] = e.state;
    return { slots: this.slots, load_ms: Math.round(this.loadMs ?? DEFAULT_ADAPTER_LOAD_MS), available: [...this.entries.keys()], resident };
  }

  /** In-flight per adapter and which are loading with requests waiting (metrics). */
  inflightByName(): Map<string, { state: AdapterState; inflight: number }> {
    return new Map([...this.entries].map(([n, e]) => [n, { state: e.state, inflight: e.inflight }]));
  }

  private entry(name: string): Entry {
    const e = this.entries.get(name);
    if (!e) throw new EbbError('adapter_not_found', `this worker has no adapter "${name}" (available: ${[...this.entries.keys()].join(', ') || 'none'})`);
    return e;
  }

  private add(source: AdapterSource): Entry {
    const e: Entry = { source, state: 'unloaded', since: new Date(), inflight: 0, loads: 0, lastUsed: 0, lastUsedAt: null, resident: false, load: undefined, ready: RESOLVED, settle: undefined, unload: 'none', lastError: null, unloadWaiters: new Set() };
    this.entries.set(source.name, e);
    return e;
  }

  private touch(e: Entry): void {
    e.lastUsed = performance.now();
    e.lastUsedAt = new Date();
  }

  /** The one setter: checked against the table, logged, announced. */
  private move(e: Entry, event: AdapterEvent, why: string): void {
    const from = e.state;
    const to = nextAdapterState(from, event);
    if (to === from) return;
    e.state = to;
    e.since = new Date();
    this.log.info({ event: 'adapter_state_changed', adapter: e.source.name, from, to, trigger: event, reason: why, inflight: e.inflight }, `adapter ${e.source.name}: ${from} -> ${to} (${why})`);
    this.emit('change');
  }

  /**
   * unloaded -> loading in this synchronous step, given a slot: a free one, or the least recently
   * used adapter that is serving with nothing in flight, drained (at once) for it, or else one whose
   * unload failed, its unload tried again. False: none.
   */
  private startLoad(e: Entry, cause?: WorkerTrace): boolean {
    let used = 0;
    for (const x of this.entries.values()) if (SLOT_STATES.has(x.state)) used++;
    let victim: Entry | undefined;
    if (used >= this.slots) {
      for (const x of this.entries.values()) if (x.state === 'serving' && x.inflight === 0 && (victim === undefined || x.lastUsed < victim.lastUsed)) victim = x;
      if (victim !== undefined) this.drain(victim.source.name, `evicted for ${e.source.name}`);
      else {
        for (const x of this.entries.values()) if (x.unload === 'failed' && (victim === undefined || x.lastUsed < victim.lastUsed)) victim = x;
        if (victim === undefined) return false;
        this.retryUnload(victim);
      }
    }
    const freed = victim === undefined ? RESOLVED : this.whenUnloaded(victim.source.name);
    this.move(e, 'load', victim === undefined ? 'a free slot' : `evicting ${victim.source.name}`);
    e.loads++;
    this.emit('load', e.source.name);
    const abort = new AbortController();
    e.ready = new Promise<void>((resolve, reject) => (e.settle = (err) => (err ? reject(err) : resolve())));
    e.ready.catch(() => undefined); // a load nobody waits on (an admin load's caller left) must not go unhandled
    const started = performance.now();
    // Tracing on: the load is a span, in the trace of the request that caused it (none for an admin's load).
    const span = workerSpan(cause, 'ebb.adapter.load', { [ATTR.adapter]: e.source.name, ...(victim === undefined ? {} : { 'ebb.adapter.evicted': victim.source.name }) });
    const settled = (async () => {
      await freed;
      abort.signal.throwIfAborted();
      await this.engine.load(e.source, abort.signal);
      e.resident = true;
    })().then(
      () => {
        const ms = performance.now() - started;
        this.loadMs = this.loadMs === undefined ? ms : 0.8 * this.loadMs + 0.2 * ms;
        span?.end('loaded');
        if (e.state === 'loading') {
          e.load = undefined;
          this.move(e, 'loaded', 'loaded');
          e.settle?.();
        }
      },
      (err: unknown) => {
        span?.end('failed', { code: 'adapter_load_failed', message: (err as Error).message });
        if (e.state !== 'loading') return; // a drain aborted it: the drain answered the holds
        e.load = undefined;
        e.lastError = `load failed: ${(err as Error).message}`;
        this.log.error({ event: 'adapter_load_failed', adapter: e.source.name, err: (err as Error).message }, `adapter ${e.source.name}: ${e.lastError}`);
        this.move(e, 'load_failed', e.lastError);
        e.settle?.(new EbbError('adapter_load_failed', `adapter "${e.source.name}" failed to load on this worker: ${(err as Error).message}`));
      },
    );
    e.load = { abort, settled };
    return true;
  }

  /** A draining adapter whose unload failed: its unload again (a no-op for any other). */
  private retryUnload(e: Entry): void {
    if (e.unload !== 'failed') return;
    this.log.info({ event: 'adapter_unload_retried', adapter: e.source.name }, `adapter ${e.source.name}: unloading it again (${e.lastError})`);
    void this.unloadWhenIdle(e);
  }

  /** Draining with nothing in flight: the engine frees its slot, then it is unloaded. */
  private async unloadWhenIdle(e: Entry): Promise<void> {
    if (e.state !== 'draining' || e.inflight > 0 || e.unload === 'running') return;
    e.unload = 'running';
    try {
      // An aborted load may still have made it resident: known once the engine's load settles.
      if (e.load !== undefined) {
        await e.load.settled;
        e.load = undefined;
      }
      if (e.resident) await this.engine.unload(e.source.name);
      e.resident = false;
      e.lastError = null;
      e.unload = 'none';
    } catch (err) {
      // Fail closed: it stays draining (its slot counted) until a retry's unload succeeds (see UnloadState).
      e.unload = 'failed';
      e.lastError = `unload failed: ${(err as Error).message}`;
      this.log.error({ event: 'adapter_unload_failed', adapter: e.source.name, err: (err as Error).message }, `adapter ${e.source.name}: ${e.lastError}`);
      // A load waiting for its slot fails now (retried on another worker), not when a retry frees it.
      this.tellUnloadWaiters(e, new Error(`evicting ${e.source.name}: ${e.lastError}`));
      return;
    }
    if (e.state !== 'draining' || e.inflight > 0) return;
    this.move(e, 'unloaded', 'nothing in flight');
    this.tellUnloadWaiters(e);
  }

  private tellUnloadWaiters(e: Entry, failed?: Error): void {
    for (const w of e.unloadWaiters) w(failed);
    e.unloadWaiters.clear();
  }
}

