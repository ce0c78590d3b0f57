import { EventEmitter } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import type { Engine, Quiescence } from '../engine/engine.js';
import { EbbError } from '../protocol/errors.js';
import type { Admission } from './admission.js';
import { nextState, type LifecycleEvent, type WorkerState } from './states.js';

/** The worker's presence in discovery. Drain removes it, resume puts it back. */
export interface Registration {
  register(): Promise<void>;
  unregister(): Promise<void>;
}

export interface LifecycleStatus {
  worker_id: string;
  state: WorkerState;
  inflight_requests: number;
  generation: number;
  admission_open: boolean;
  discovery_registered: boolean;
  shutting_down: boolean;
  /** What a drain still waits for; empty unless draining. */
  waiting_for: string[];
  drain_reason: string | null;
  state_since: string;
  last_error: string | null;
}

export interface Transition {
  from: WorkerState;
  to: WorkerState;
  event: LifecycleEvent;
  generation: number;
}

export class ShutdownConflict extends EbbError {
  constructor(action: string) {
    super('shutdown_in_progress', `cannot ${action}: the worker is shutting down (SIGTERM)`);
  }
}

/**
 * Owns the drain: the HTTP caller only starts it, so a caller that disconnects never strands the
 * worker half-drained. Drain and resume are serialised; each bumps the generation, and anything
 * asynchronous (an idleness probe, a registration) only applies if its generation is still current.
 */
export class Lifecycle extends EventEmitter {
  private current: WorkerState = 'serving';
  private generation = 0;
  private since = new Date();
  private chain: Promise<unknown> = Promise.resolve();
  private shuttingDown = false;
  /**
   * Registration bookkeeping as epochs, not a flag: a loss bumps `lossEpoch`, and a registration
   * only counts for the epoch it started in. A lease lost while a register() call is in flight
   * therefore still reads as "not registered", and the retry registers again.
   */
  private lossEpoch = 0;
  private registeredEpoch: number | null = null;

  private get registered(): boolean {
    return this.registeredEpoch === this.lossEpoch;
  }

  /** register(), recorded against the epoch it started in. */
  private async register(): Promise<void> {
    const epoch = this.lossEpoch;
    await this.registration.register();
    this.registeredEpoch = epoch;
  }
  private unregistering = false;
  private resuming = false;
  private lastProbe: Quiescence | null = null;
  private lastError: string | null = null;
  private reason: string | null = null;

  constructor(
    private readonly workerId: string,
    private readonly admission: Admission,
    private readonly engine: Engine,
    private readonly registration: Registration,
    private readonly log: Logger,
  ) {
    super();
    admission.on('idle', () => void this.evaluate());
    engine.onQuiescenceChange(() => void this.evaluate());
  }

  get state(): WorkerState {
    return this.current;
  }

  get isShuttingDown(): boolean {
    return this.shuttingDown;
  }

  /** First registration at start-up. A worker that cannot register does not start. */
  async start(): Promise<void> {
    await this.register();
    this.log.info({ event: 'discovery_registered' }, 'registered in discovery');
  }

  drain(reason: string, opts: { rollbackOnFailure?: boolean } = {}): Promise<LifecycleStatus> {
    return this.serialize(() => this.doDrain(reason, opts.rollbackOnFailure ?? true));
  }

  resume(): Promise<LifecycleStatus> {
    if (this.shuttingDown) return Promise.reject(new ShutdownConflict('resume'));
    return this.serialize(() => this.doResume());
  }

  /**
   * Discovery lost our registration (lease expired). Re-register only while serving: a draining or
   * drained worker being absent from discovery is the point.
   */
  async registrationLost(): Promise<void> {
    this.lossEpoch++;
    // Each attempt takes its turn in the serialised chain; the back-off waits outside it, so a drain
    // issued while discovery is down is never stuck behind the retries. The cap stays well under the
    // shortest lease TTL (2 s on etcd): after an outage, frontends must not see the fleet vanish.
    for (let backoff = 100; ; backoff = Math.min(backoff * 2, 1000)) {
      const settled = await this.serialize(async () => {
        if (this.current !== 'serving' || this.shuttingDown || this.registered) return true;
        try {
          await this.register();
          if (!this.registered) return false; // lost again while registering
          this.lastError = null;
          this.log.warn({ event: 'discovery_reregistered' }, 'registration was lost; registered again');
          return true;
        } catch (err) {
          this.lastError = `re-register failed: ${(err as Error).message}`;
          this.log.error({ event: 'discovery_register_failed', err, retry_in_ms: backoff }, this.lastError);
          return false;
        }
      });
      if (settled) return;
      await sleep(backoff);
    }
  }

  /** From now on resume is refused; the SIGTERM orchestrator drives the rest. */
  beginShutdown(): void {
    this.shuttingDown = true;
  }

  /** Resolves when the worker reaches drained (in this or a later generation); rejects if `signal` aborts first. */
  whenDrained(signal?: AbortSignal): Promise<void> {
    if (this.current === 'drained') return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      const onTransition = (t: Transition) => {
        if (t.to !== 'drained') return;
        cleanup();
        resolve();
      };
      const onAbort = () => {
        cleanup();
        reject(signal?.reason);
      };
      const cleanup = () => {
        this.off('transition', onTransition);
        signal?.removeEventListener('abort', onAbort);
      };
      this.on('transition', onTransition);
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  status(): LifecycleStatus {
    return {
      worker_id: this.workerId,
      state: this.current,
      inflight_requests: this.admission.inflight,
      generation: this.generation,
      admission_open: this.admission.open,
      discovery_registered: this.registered,
      shutting_down: this.shuttingDown,
      waiting_for: this.waitingFor(),
      drain_reason: this.current === 'serving' ? null : this.reason,
      state_since: this.since.toISOString(),
      last_error: this.lastError,
    };
  }

  private waitingFor(): string[] {
    if (this.current !== 'draining') return [];
    const waits: string[] = [];
    if (this.unregistering) waits.push('discovery: unregistering');
    const n = this.admission.inflight;
    if (n > 0) waits.push(`${n} in-flight request${n === 1 ? '' : 's'}`);
    else if (this.lastProbe?.state === 'busy') waits.push(...this.lastProbe.waiting_for);
    else if (this.lastProbe?.state === 'unknown') waits.push(`engine idleness unknown (fail-closed): ${this.lastProbe.reason}`);
    return waits;
  }

  private serialize<T>(op: () => Promise<T>): Promise<T> {
    const run = this.chain.then(op, op);
    this.chain = run.catch(() => undefined);
    return run;
  }

  private move(event: LifecycleEvent): void {
    const from = this.current;
    const to = nextState(from, event);
    if (to === from) return;
    this.current = to;
    this.since = new Date();
    const t: Transition = { from, to, event, generation: this.generation };
    this.log.info({ event: 'state_changed', from, to, trigger: event, generation: this.generation, inflight: this.admission.inflight }, `${from} -> ${to}`);
    this.emit('transition', t);
  }

  private async doDrain(reason: string, rollbackOnFailure: boolean): Promise<LifecycleStatus> {
    if (this.current !== 'serving') return this.status();
    this.generation++;
    const gen = this.generation;
    // Admission closes before anything else: from here a late arrival gets a retryable 503.
    this.admission.close();
    this.reason = reason;
    this.lastProbe = null;
    this.log.info({ event: 'admission_closed', generation: gen, reason }, 'admission closed');
    this.move('drain');
    this.unregistering = true;
    try {
      // A lost registration (lease expired) is already out of discovery: nothing to undo, and a
      // discovery outage must not stop an operator from draining.
      if (this.registered) await this.registration.unregister();
      this.registeredEpoch = null;
      this.log.info({ event: 'discovery_unregistered', generation: gen }, 'unregistered from discovery');
    } catch (err) {
      this.lastError = `unregister failed: ${(err as Error).message}`;
      this.log.error({ event: 'discovery_unregister_failed', err }, this.lastError);
      if (rollbackOnFailure) {
        this.unregistering = false;
        this.admission.reopen();
        this.move('unregister_failed');
        throw new EbbError('discovery_unavailable', `drain rolled back: ${this.lastError}`);
      }
    } finally {
      this.unregistering = false;
    }
    await this.evaluate();
    return this.status();
  }

  private async doResume(): Promise<LifecycleStatus> {
    if (this.shuttingDown) throw new ShutdownConflict('resume');
    const previous = this.current;
    if (previous === 'serving' && this.registered) return this.status();
    this.generation++;
    // Register before reopening: until both are done nothing is admitted, so a failed registration
    // leaves the state exactly as it was, and no drain can complete under a half-done resume.
    this.resuming = true;
    try {
      await this.register();
    } catch (err) {
      this.lastError = `register failed: ${(err as Error).message}`;
      this.log.error({ event: 'discovery_register_failed', err }, this.lastError);
      throw new EbbError('discovery_unavailable', `resume failed, state stays ${previous}: ${this.lastError}`);
    } finally {
      this.resuming = false;
      if (!this.registered) void this.evaluate(); // the last request may have ended meanwhile
    }
    this.admission.reopen();
    this.lastError = null;
    this.lastProbe = null;
    this.move('resume');
    this.log.info({ event: 'resumed', generation: this.generation }, 'registered and admission reopened');
    return this.status();
  }

  /**
   * Called on every event that may end a drain. The engine probe is asynchronous, so its answer is
   * fenced: it only counts if no drain or resume happened meanwhile and nothing was admitted.
   */
  private async evaluate(): Promise<void> {
    if (this.current !== 'draining' || this.unregistering || this.resuming || this.admission.inflight > 0) return;
    const gen = this.generation;
    let probe: Quiescence;
    try {
      probe = await this.engine.probeQuiescence();
    } catch (err) {
      probe = { state: 'unknown', reason: `idleness probe failed: ${(err as Error).message}` };
    }
    if (gen !== this.generation || this.current !== 'draining' || this.admission.inflight > 0) return;
    this.lastProbe = probe;
    if (probe.state === 'idle') this.move('idle_confirmed');
    else this.emit('waiting', this.waitingFor());
  }
}
