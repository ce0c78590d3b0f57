import { EventEmitter } from 'node:events';
import type { Logger } from 'pino';
import { Backoff, pause } from '../common/backoff.js';
import type { Engine, Quiescence } from '../engine/engine.js';
import type { DiscoveryPresence, WorkerStatus } from '../protocol/admin.js';
import { EbbError } from '../protocol/errors.js';
import type { Admission } from './admission.js';
import { AuditTrail, ENGINE_ACTOR, SIGNAL_ACTOR } from './audit.js';
import { InflightHistory } from './inflight-history.js';
import { canMove, checkMove, nextState, SHUTDOWN_STATES, type Deadline, type Drain, type Draining, type LifecycleEvent, type LifecycleState, type Stopping, type WorkerState } from './states.js';

/** The worker's presence in discovery. Drain removes it, resume puts it back. */
export interface Registration {
  register(): Promise<void>;
  /** Idempotent: removing what is already gone succeeds. Throws when discovery did not confirm. */
  unregister(): Promise<void>;
}

export type LifecycleStatus = Omit<WorkerStatus, 'engine'>;

export interface Transition {
  from: WorkerState;
  to: WorkerState;
  event: LifecycleEvent;
  generation: number;
}

export class ShutdownConflict extends EbbError {
  constructor(action: string, state: WorkerState = 'stopping') {
    super('shutdown_in_progress', `cannot ${action}: the worker is shutting down (${state === 'failed' ? 'its engine failed' : 'SIGTERM'})`);
  }
}

/** Back-off between attempts at an unconfirmed unregister: a discovery outage is waited out, not hammered. */
const UNREGISTER_RETRY = { minMs: 250, maxMs: 5000, jitter: true };

export interface DrainOptions {
  /** After this many ms, streams still running are handed off to other workers (stream migration). */
  deadlineMs?: number | undefined;
  /** Who asked, for the audit trail: an admin token's name, or the caller's address (default "unknown"). */
  actor?: string | undefined;
  /**
   * Whether the drain outlives this process (a drain intent, where discovery keeps one); default
   * true. False for drains that something else undoes: a rollout's, a Pod annotation's.
   */
  persist?: boolean | undefined;
}

/** Emitted as `drain_accepted` for every drain call that was not refused (a first one, or a repeat). */
export interface DrainAccepted {
  reason: string;
  persist: boolean;
}

export interface ResumeOptions {
  /** Who asked, for the audit trail (see DrainOptions.actor). */
  actor?: string | undefined;
  /**
   * Resume only the drain of this generation (the one a drain call answered with): a drain that
   * someone else made since (or a resume and drain again) is theirs to undo, and stays (the call
   * is refused, and audited as such).
   */
  onlyGeneration?: number | undefined;
}

/** Estimates how long until a drain completes (ms), or null when it cannot tell. */
export type EtaSource = () => number | null;

/**
 * Owns the drain: the HTTP caller only starts it, so a caller that disconnects never strands the
 * worker half-drained. Drain and resume are serialised; each bumps the generation, and anything
 * asynchronous (an idleness probe, a registration, an unregister retry) only applies if its
 * generation is still current. Shutdown is a state (stopping): entered synchronously, it closes
 * admission for good and makes every later drain or resume a 409 at its entry.
 */
export class Lifecycle extends EventEmitter {
  /** The whole state (see states.ts): changed only by set(). */
  private current: LifecycleState = { name: 'loading' };
  /** When the state's name last changed (status `state_since`): a field update does not move it. */
  private since = new Date();
  /** Not per state: every drain, resume and shutdown bumps it, whatever the state (status `generation`). */
  private generation = 0;
  private chain: Promise<unknown> = Promise.resolve();
  /**
   * Discovery presence is orthogonal to the state, not part of it: a lease can be lost while
   * serving, and an unregister can stay unconfirmed while draining, drained or stopping.
   * What discovery confirmed, never what we hope: `unknown` after an unregister that discovery did
   * not confirm (it is retried until it is). A loss bumps `lossEpoch`, and a registration only
   * counts for the epoch it started in, so a lease lost while register() is in flight still reads
   * as not registered and the retry registers again. `lastError` is discovery's last failure,
   * cleared by the next resume that registers, whatever the state.
   */
  private presence: DiscoveryPresence = 'unregistered';
  private lossEpoch = 0;
  private lastError: string | null = null;
  private etaSource: EtaSource | undefined;
  /**
   * Unset while the engine loads (`loading`, which can take minutes for a real model): the state is
   * the lifecycle's from the process's start, and nothing that needs the engine can run before it.
   */
  private engine: Engine | undefined;
  /** What loading is doing now ("starting engine llama-cpp"), while the engine loads. */
  loadingDetail = 'starting the engine';
  /** Every drain, resume, shutdown and hand-off (GET /engine/events). */
  readonly audit: AuditTrail;
  /** The last minute of in-flight counts, for a dashboard that opens now. */
  readonly inflightHistory = new InflightHistory();

  constructor(
    private readonly workerId: string,
    private readonly admission: Admission,
    engine: Engine | undefined,
    private readonly registration: Registration,
    private readonly log: Logger,
  ) {
    super();
    this.audit = new AuditTrail(log);
    admission.on('idle', () => void this.evaluate());
    // In-flight changes, for status streams (coalesced there).
    const changed = () => {
      this.inflightHistory.record(admission.inflight);
      this.emit('inflight');
    };
    admission.on('admitted', changed);
    admission.on('released', changed);
    if (engine !== undefined) this.engineLoaded(engine);
  }

  /** The engine is loaded: `start` may register from now on. Once. */
  engineLoaded(engine: Engine): void {
    if (this.engine !== undefined) throw new Error('the engine is already loaded');
    this.engine = engine;
    engine.onQuiescenceChange(() => void this.evaluate());
  }

  get engineReady(): boolean {
    return this.engine !== undefined;
  }

  get state(): WorkerState {
    return this.current.name;
  }

  get isShuttingDown(): boolean {
    return SHUTDOWN_STATES.has(this.current.name);
  }

  /** What the engine failed with, once it did (`failed`, and `stopped` after it): /live fails with it. */
  get engineFailure(): string | undefined {
    const s = this.current;
    return s.name === 'failed' || s.name === 'stopped' ? s.cause : undefined;
  }

  get discoveryPresence(): DiscoveryPresence {
    return this.presence;
  }

  /**
   * First registration at start-up: loading -> serving. A worker that cannot register does not
   * start. One drained meanwhile (an operator, before it ever registered) stays out of discovery.
   */
  start(): Promise<void> {
    return this.serialize(async () => {
      if (this.engine === undefined) throw new Error('cannot register before the engine is loaded');
      if (!canMove(this.current.name, 'start')) return;
      if (!(await this.register())) throw new Error('registration was lost while it was being made');
      // A shutdown that began meanwhile owns the worker now, and unregisters it again.
      if (!canMove(this.current.name, 'start')) return;
      this.set({ name: 'serving' }, 'start');
      this.log.info({ event: 'discovery_registered' }, 'registered in discovery');
    });
  }

  /** `deadlineMs`: after it, streams still running are handed off to other workers (stream migration). */
  drain(reason: string, opts: DrainOptions = {}): Promise<LifecycleStatus> {
    const actor = opts.actor ?? 'unknown';
    return this.audited('drain', reason, actor, () => {
      if (!canMove(this.current.name, 'drain')) return Promise.reject(this.refusal('drain'));
      return this.serialize(() => this.doDrain(reason, opts, actor));
    });
  }

  resume(opts: ResumeOptions = {}): Promise<LifecycleStatus> {
    return this.audited('resume', null, opts.actor ?? 'unknown', () => {
      if (!canMove(this.current.name, 'resume')) return Promise.reject(this.refusal('resume'));
      return this.serialize(() => {
        const only = opts.onlyGeneration;
        if (only !== undefined && only !== this.generation) return Promise.reject(new Error(`the drain of generation ${only} was superseded (now generation ${this.generation}, ${this.current.name}): it stays`));
        return this.doResume();
      });
    });
  }

  /** Why the table has no such move from here: the worker is going down, or has not started. */
  private refusal(action: 'drain' | 'resume'): EbbError {
    if (this.isShuttingDown) return new ShutdownConflict(action, this.current.name);
    return new EbbError('worker_loading', `cannot ${action}: the worker has not registered yet (state ${this.current.name}); retry when /health is ready`);
  }

  /** Runs an Admin operation and records it, whichever way it ends. */
  private async audited(what: 'drain' | 'resume', reason: string | null, actor: string, op: () => Promise<LifecycleStatus>): Promise<LifecycleStatus> {
    const startedAt = performance.now();
    let done!: () => void;
    const recorded = new Promise<void>((resolve) => (done = resolve));
    this.auditPending.add(recorded);
    try {
      const status = await op();
      this.audit.record({ what, reason, actor, generation: status.generation, result: status.state, startedAt });
      return status;
    } catch (err) {
      const result = err instanceof EbbError ? `refused: ${err.code}` : `failed: ${(err as Error).message}`;
      this.audit.record({ what, reason, actor, generation: this.generation, result, startedAt });
      throw err;
    } finally {
      this.auditPending.delete(recorded);
      done();
    }
  }

  /**
   * Audit records still to be written (a drain call under way, hand-offs whose streams are still
   * closing): a `drained` record waits for them, so the trail reads in the order things began.
   */
  private readonly auditPending = new Set<Promise<void>>();

  /** Where status() reads `eta_ms` from while a drain or shutdown waits (see drain-eta). */
  setEtaSource(source: EtaSource): void {
    this.etaSource = source;
  }

  /**
   * Discovery lost our registration (lease expired, key deleted behind our back). Re-register only
   * while serving: a draining or drained worker being absent from discovery is the point.
   */
  async registrationLost(): Promise<void> {
    this.lossEpoch++;
    if (this.presence === 'registered') this.presence = 'unregistered';
    // Each attempt takes its turn in the serialised chain; the back-off waits outside it, so a drain
    // issued while discovery is down is never stuck behind the retries. The cap stays well under the
    // shortest lease TTL (2 s on etcd): after an outage, frontends must not see the fleet vanish.
    const backoff = new Backoff({ minMs: 100, maxMs: 1000, jitter: true });
    for (;;) {
      const delay = backoff.next();
      const settled = await this.serialize(async () => {
        if (this.current.name !== 'serving' || this.presence === 'registered') return true;
        try {
          if (!(await this.register())) return false; // lost again while registering
          this.lastError = null;
          this.log.warn({ event: 'discovery_reregistered' }, 'registration was lost; registered again');
          return true;
        } catch (err) {
          this.lastError = `re-register failed: ${(err as Error).message}`;
          this.log.error({ event: 'discovery_register_failed', err, retry_in_ms: delay }, this.lastError);
          return false;
        }
      });
      if (settled) return;
      await pause(delay);
    }
  }

  /**
   * The worker's record changed (its adapters): written again, in the serialised chain, only while
   * serving and registered; a draining worker stays out of discovery, and a later registration
   * writes the record as it is then.
   */
  republish(): Promise<void> {
    return this.serialize(async () => {
      if (this.current.name !== 'serving' || this.presence !== 'registered') return;
      try {
        await this.register();
      } catch (err) {
        this.log.warn({ event: 'discovery_republish_failed', err: (err as Error).message }, `the changed record was not written: ${(err as Error).message}`);
      }
    });
  }

  /**
   * SIGTERM: from here the worker only goes down. Synchronous, so no drain, resume or admission can
   * slip in after it; a resume already registering finds the state moved and does not reopen.
   * Returns false when shutdown had already begun (shutdown refuses unless it is not running yet).
   * `deadlineAt` (ms epoch): when the shutdown hands off what still runs; shown in status. `actor`:
   * who, for the audit trail.
   */
  beginShutdown(reason: string, deadlineAt?: number, actor = SIGNAL_ACTOR): boolean {
    const from = this.current;
    if (!canMove(from.name, 'shutdown')) return false;
    this.admission.close();
    this.generation++;
    this.audit.record({ what: 'shutdown', reason, actor, generation: this.generation, result: 'started', startedAt: performance.now() });
    // The shutdown runs its own hand-off stage; an earlier Admin deadline still fires first.
    let deadline = deadlineOf(from);
    if (deadlineAt !== undefined && (deadline === null || deadlineAt < deadline.at)) {
      clearTimer(deadline);
      deadline = { at: deadlineAt, timer: undefined };
    }
    this.set({ name: 'stopping', drain: { reason, actor, handedOff: drainOf(from)?.handedOff ?? 0 }, deadline, probe: null, quiescent: false }, 'shutdown');
    void this.evaluate();
    return true;
  }

  /**
   * The shutdown's unregister stage: keeps trying until discovery confirms or `signal` aborts.
   * `skipped` when nothing was registered, so routers have nothing to converge on.
   */
  async unregisterForShutdown(signal: AbortSignal): Promise<'completed' | 'skipped' | 'timed_out'> {
    await this.chain; // a resume that was registering finishes first, then is undone here
    if (this.presence === 'unregistered') return 'skipped';
    const confirmed = await this.unregisterUntilConfirmed(() => signal.aborted, signal);
    return confirmed ? 'completed' : 'timed_out';
  }

  /**
   * The engine died under the worker (`cause`: its message): from here it only goes down, as after
   * SIGTERM, but nothing admitted can finish, so nothing is waited for or handed off. Synchronous,
   * like beginShutdown. Returns false when it had already failed or stopped.
   */
  engineFailed(cause: string): boolean {
    const from = this.current;
    if (!canMove(from.name, 'engine_failed')) return false;
    this.admission.close();
    this.generation++;
    const reason = `engine failed: ${cause}`;
    clearTimer(deadlineOf(from));
    // A shutdown under way stays its starter's in the audit trail.
    const actor = from.name === 'stopping' ? from.drain.actor : ENGINE_ACTOR;
    if (from.name !== 'stopping') this.audit.record({ what: 'shutdown', reason, actor, generation: this.generation, result: 'started', startedAt: performance.now() });
    this.set({ name: 'failed', cause, drain: { reason, actor, handedOff: drainOf(from)?.handedOff ?? 0 } }, 'engine_failed');
    return true;
  }

  /** The last stage of a shutdown is done: servers closed, nothing runs. */
  stopped(): void {
    const from = this.current;
    if (from.name !== 'stopping' && from.name !== 'failed') return;
    clearTimer(deadlineOf(from));
    this.set({ name: 'stopped', drain: from.drain, cause: from.name === 'failed' ? from.cause : undefined }, 'stopped');
  }

  /**
   * Streams the worker handed off at the deadline: counted in status as `handed_off`, and audited
   * (on behalf of whoever set the deadline) once `closed` settles, i.e. the streams are released.
   */
  recordHandoffs(n: number, closed: Promise<void> = Promise.resolve()): void {
    if (n === 0) return;
    const s = this.current;
    if ('drain' in s) this.set({ ...s, drain: { ...s.drain, handedOff: s.drain.handedOff + n } });
    const drain = drainOf(s);
    const startedAt = performance.now();
    const actor = drain?.actor ?? 'unknown';
    const generation = this.generation;
    const reason = drain?.reason ?? null;
    const recorded = closed.then(
      () => void this.audit.record({ what: 'handoff', reason, actor, generation, result: `handed_off ${n}`, detail: { streams: n }, startedAt }),
      (err: unknown) => void this.audit.record({ what: 'handoff', reason, actor, generation, result: `failed: ${(err as Error).message}`, detail: { streams: n }, startedAt }),
    );
    this.auditPending.add(recorded);
    void recorded.then(() => this.auditPending.delete(recorded));
  }

  /**
   * The hand-off deadline `ms` from now, unless `current` is earlier (kept as it is). A timer is
   * right here: the deadline is a point in time the operator chose, not a stand-in for an event.
   * When it passes with work still running, `handoff_due` asks the worker to hand off.
   */
  private deadlineIn(ms: number, current: Deadline | null): Deadline {
    const at = Date.now() + ms;
    if (current !== null && current.at <= at) return current;
    clearTimer(current);
    const timer = setTimeout(() => this.deadlinePassed(timer), ms);
    return { at, timer };
  }

  private deadlinePassed(timer: NodeJS.Timeout): void {
    const s = this.current;
    if (!('deadline' in s) || s.deadline?.timer !== timer) return;
    this.set({ ...s, deadline: { at: s.deadline.at, timer: undefined } });
    if ((s.name === 'draining' || s.name === 'stopping') && this.admission.inflight > 0) {
      this.log.info({ event: 'drain_deadline', inflight: this.admission.inflight }, `drain deadline passed with ${this.admission.inflight} request(s) in flight: handing off`);
      this.emit('handoff_due');
    }
  }

  /** Resolves when the worker reaches drained (in this or a later generation); rejects if `signal` aborts first. */
  whenDrained(signal?: AbortSignal): Promise<void> {
    return this.until(() => this.current.name === 'drained', signal);
  }

  /** Shutdown: resolves once nothing is in flight and the engine confirmed idle; rejects if `signal` aborts first. */
  whenQuiescent(signal?: AbortSignal): Promise<void> {
    return this.until(() => this.current.name === 'stopping' && this.current.quiescent, signal);
  }

  private until(done: () => boolean, signal?: AbortSignal): Promise<void> {
    if (done()) return Promise.resolve();
    if (signal?.aborted) return Promise.reject(signal.reason);
    return new Promise<void>((resolve, reject) => {
      const check = () => {
        if (!done()) return;
        cleanup();
        resolve();
      };
      const onAbort = () => {
        cleanup();
        reject(signal?.reason);
      };
      const cleanup = () => {
        this.off('transition', check);
        this.off('quiescent', check);
        signal?.removeEventListener('abort', onAbort);
      };
      this.on('transition', check);
      this.on('quiescent', check);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  status(): LifecycleStatus {
    const drain = drainOf(this.current);
    const deadline = deadlineOf(this.current);
    return {
      worker_id: this.workerId,
      state: this.current.name,
      inflight_requests: this.admission.inflight,
      generation: this.generation,
      admission_open: this.admission.open,
      discovery_registered: this.presence === 'registered',
      discovery: this.presence,
      shutting_down: this.isShuttingDown,
      waiting_for: this.waitingFor(),
      drain_reason: drain?.reason ?? null,
      drain_deadline: deadline === null ? null : new Date(deadline.at).toISOString(),
      handed_off: drain?.handedOff ?? 0,
      eta_ms: this.eta(),
      state_since: this.since.toISOString(),
      last_error: this.lastError,
    };
  }

  /** The state while it waits for in-flight work and the engine's idleness (draining, stopping not yet quiescent); else null. */
  private waiting(): Draining | Stopping | null {
    const s = this.current;
    return s.name === 'draining' || (s.name === 'stopping' && !s.quiescent) ? s : null;
  }

  /**
   * How long until the wait ends, while draining or stopping: the estimate of the ETA source,
   * capped by the hand-off deadline (past it, what still runs is handed off). Null when nothing is
   * waited for, when there is no estimate, and when the engine cannot tell its idleness (fail-closed:
   * such a worker never drains, so no time is honest).
   */
  private eta(): number | null {
    const w = this.waiting();
    if (w === null || w.probe?.state === 'unknown') return null;
    if (this.admission.inflight === 0) return w.probe?.state === 'busy' ? null : 0;
    const estimate = this.etaSource?.() ?? null;
    const untilDeadline = w.deadline === null ? null : Math.max(0, w.deadline.at - Date.now());
    if (estimate === null) return untilDeadline;
    return untilDeadline === null ? Math.round(estimate) : Math.round(Math.min(estimate, untilDeadline));
  }

  /** The last idleness answer of the engine in this drain or shutdown, for the shutdown's report. */
  get lastQuiescence(): Quiescence | null {
    const s = this.current;
    return s.name === 'draining' || s.name === 'stopping' ? s.probe : null;
  }

  private waitingFor(): string[] {
    const w = this.waiting();
    if (w === null) return [];
    const waits: string[] = [];
    const n = this.admission.inflight;
    if (n > 0) {
      const handoff = w.deadline === null ? '' : ` (hands off to other workers at ${new Date(w.deadline.at).toISOString()})`;
      waits.push(`${n} in-flight request${n === 1 ? '' : 's'}${handoff}`);
    }
    else if (w.probe?.state === 'busy') waits.push(...w.probe.waiting_for);
    else if (w.probe?.state === 'unknown') waits.push(`engine idleness unknown (fail-closed): ${w.probe.reason}`);
    return waits;
  }

  private serialize<T>(op: () => Promise<T>): Promise<T> {
    const run = this.chain.then(op, op);
    this.chain = run.catch(() => undefined);
    return run;
  }

  /**
   * The one state setter. With an `event`, a move: checked against the table, logged, emitted as
   * `transition` (a move to the same state, an idempotent one, is neither). Without, an update of
   * the fields of the state the worker is in, which must keep its name.
   */
  private set(next: LifecycleState, event: LifecycleEvent | null = null): void {
    const from = this.current.name;
    checkMove(from, event, next.name);
    this.current = next;
    if (event === null || next.name === from) return;
    const to = next.name;
    this.since = new Date();
    const t: Transition = { from, to, event, generation: this.generation };
    this.log.info({ event: 'state_changed', from, to, trigger: event, generation: this.generation, inflight: this.admission.inflight }, `${from} -> ${to}`);
    this.emit('transition', t);
  }

  /** register(), counted only for the loss epoch it started in. False when a loss came meanwhile. */
  private async register(): Promise<boolean> {
    const epoch = this.lossEpoch;
    await this.registration.register();
    if (epoch !== this.lossEpoch) return false;
    this.presence = 'registered';
    return true;
  }

  /** One unregister attempt; bookkeeping changes only once discovery confirmed it. */
  private async unregisterOnce(): Promise<boolean> {
    try {
      await this.registration.unregister();
      this.presence = 'unregistered';
      this.log.info({ event: 'discovery_unregistered', generation: this.generation }, 'unregistered from discovery');
      return true;
    } catch (err) {
      this.presence = 'unknown';
      this.lastError = `unregister failed: ${(err as Error).message}`;
      this.log.error({ event: 'discovery_unregister_failed', err }, `${this.lastError}; admission stays closed, retrying`);
      return false;
    }
  }

  /**
   * Attempts (each in the serialised chain) with back-off until discovery confirms, the
   * registration is gone anyway (lease lost), or `stale()` says a later operation took over.
   */
  private async unregisterUntilConfirmed(stale: () => boolean, signal?: AbortSignal): Promise<boolean> {
    const backoff = new Backoff(UNREGISTER_RETRY);
    for (;;) {
      const confirmed = await this.serialize(async () => (stale() ? false : this.presence === 'unregistered' || (await this.unregisterOnce())));
      if (confirmed) return true;
      if (stale()) return false;
      if (!(await pause(backoff.next(), signal))) return false;
    }
  }

  private async doDrain(reason: string, opts: DrainOptions, actor: string): Promise<LifecycleStatus> {
    // Refused before any effect: a shutdown that began while this call waited its turn owns the
    // hand-off time, and a refused drain must not move it.
    const from = this.current;
    if (!canMove(from.name, 'drain')) throw this.refusal('drain');
    const accepted = (): DrainAccepted => ({ reason: drainOf(this.current)?.reason ?? reason, persist: opts.persist !== false });
    if (nextState(from.name, 'drain') === from.name) {
      // A drain already under way may still be given a deadline, or an earlier one.
      if (opts.deadlineMs !== undefined && 'deadline' in from) this.set({ ...from, deadline: this.deadlineIn(opts.deadlineMs, from.deadline) });
      this.emit('drain_accepted', accepted());
      return this.status();
    }
    this.generation++;
    const gen = this.generation;
    // Admission closes before anything else: from here a late arrival gets a retryable 503, and
    // that holds with or without discovery, so an outage never stops an operator from draining.
    this.admission.close();
    this.log.info({ event: 'admission_closed', generation: gen, reason, deadline_ms: opts.deadlineMs ?? null }, 'admission closed');
    const deadline = opts.deadlineMs === undefined ? null : this.deadlineIn(opts.deadlineMs, null);
    this.set({ name: 'draining', drain: { reason, actor, handedOff: 0 }, calledAt: performance.now(), deadline, probe: null, resuming: false }, 'drain');
    this.emit('drain_accepted', accepted());
    // A lost registration (lease expired) is already out of discovery: nothing to remove.
    if (this.presence !== 'unregistered' && !(await this.unregisterOnce())) {
      void this.unregisterUntilConfirmed(() => this.generation !== gen);
    }
    await this.evaluate();
    return this.status();
  }

  private async doResume(): Promise<LifecycleStatus> {
    const from = this.current;
    if (!canMove(from.name, 'resume')) throw this.refusal('resume');
    const previous = from.name;
    if (previous === 'serving' && this.presence === 'registered') return this.status();
    this.generation++;
    // Register before reopening: until both are done nothing is admitted, so a failed registration
    // leaves the state exactly as it was, and no drain can complete under a half-done resume.
    if (from.name === 'draining') this.set({ ...from, resuming: true });
    try {
      // A loss during the call is not a failure here: registrationLost() is queued behind us and
      // registers again once we are serving.
      await this.register();
    } catch (err) {
      this.lastError = `register failed: ${(err as Error).message}`;
      this.log.error({ event: 'discovery_register_failed', err }, this.lastError);
      // Out of rotation still: what discovery holds is unknown (the register may have been written,
      // its answer lost; or an earlier unregister was not confirmed, and this call superseded its
      // retry). Confirmed as after a failed unregister: retried until discovery answers.
      if (previous !== 'serving') {
        this.presence = 'unknown';
        const gen = this.generation;
        void this.unregisterUntilConfirmed(() => this.generation !== gen);
      }
      throw new EbbError('discovery_unavailable', `resume failed, state stays ${previous}: ${this.lastError}`);
    } finally {
      const now = this.current;
      if (now.name === 'draining' && now.resuming) this.set({ ...now, resuming: false });
      if (this.presence !== 'registered') void this.evaluate(); // the last request may have ended meanwhile
    }
    // SIGTERM arrived while registering: the shutdown owns the worker now and unregisters it again.
    if (this.isShuttingDown) throw new ShutdownConflict('resume');
    this.admission.reopen();
    this.lastError = null;
    clearTimer(deadlineOf(this.current));
    this.set({ name: 'serving' }, 'resume');
    this.log.info({ event: 'resumed', generation: this.generation }, 'registered and admission reopened');
    return this.status();
  }

  /**
   * Called on every event that may end a drain or a shutdown's wait. The engine probe is
   * asynchronous, so its answer is fenced: it only counts if no drain, resume or shutdown happened
   * meanwhile and nothing was admitted.
   */
  private async evaluate(): Promise<void> {
    const waiting = this.waiting();
    if (waiting === null || (waiting.name === 'draining' && waiting.resuming) || this.admission.inflight > 0) return;
    const gen = this.generation;
    let probe: Quiescence;
    try {
      probe = this.engine ? await this.engine.probeQuiescence() : { state: 'unknown', reason: 'the engine is still loading' };
    } catch (err) {
      probe = { state: 'unknown', reason: `idleness probe failed: ${(err as Error).message}` };
    }
    const now = this.current;
    if (gen !== this.generation || now.name !== waiting.name || this.admission.inflight > 0) return;
    if (now.name === 'draining') {
      if (now.resuming) return;
      if (probe.state !== 'idle') return this.stillWaiting({ ...now, probe });
      this.set({ name: 'drained', drain: now.drain, calledAt: now.calledAt, deadline: now.deadline }, 'idle_confirmed');
      // Dated when drained was reached (its duration still spans the whole drain, from the call):
      // read by time, it comes after the hand-offs that led to it.
      const d = now.drain;
      const record = { what: 'drained' as const, reason: d.reason, actor: d.actor, generation: gen, result: 'drained', detail: { handed_off: d.handedOff }, startedAt: now.calledAt, endedAt: performance.now(), atWall: Date.now() };
      void Promise.all([...this.auditPending]).then(() => this.audit.record(record));
    } else if (now.name === 'stopping') {
      if (probe.state !== 'idle') return this.stillWaiting({ ...now, probe });
      this.set({ ...now, probe, quiescent: true });
      this.log.info({ event: 'quiescent', generation: gen }, 'nothing in flight and the engine is idle');
      this.emit('quiescent');
    }
  }

  /** The engine's answer was not idle: kept (status says what is waited for) and announced. */
  private stillWaiting(next: Draining | Stopping): void {
    this.set(next);
    this.emit('waiting', this.waitingFor());
  }
}

/** The drain a state winds down under (its own, or the shutdown's); null while loading or serving. */
function drainOf(s: LifecycleState): Drain | null {
  return 'drain' in s ? s.drain : null;
}

/** The hand-off deadline a state holds (draining, drained, stopping); null otherwise. */
function deadlineOf(s: LifecycleState): Deadline | null {
  return 'deadline' in s ? s.deadline : null;
}

function clearTimer(deadline: Deadline | null): void {
  if (deadline?.timer) clearTimeout(deadline.timer);
}
