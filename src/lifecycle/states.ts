import type { Quiescence } from '../engine/engine.js';
import { WORKER_STATES, type WorkerState } from '../protocol/admin.js';

/**
 * The worker lifecycle, as one table. Side effects belong to the controller (lifecycle.ts);
 * this file only says which moves exist. A move that is not in the table is refused at the entry
 * of the operation that asked for it, before any effect (drain and resume during shutdown answer
 * 409, a resume while loading 503 worker_loading).
 *
 *   from      | event          | to        | what the controller does around it
 *   ----------+----------------+-----------+---------------------------------------------------------
 *   loading   | start          | serving   | the first registration confirmed (the worker can serve);
 *             |                |           |   refused before the engine is loaded (the lifecycle
 *             |                |           |   exists, in loading, from the process's start)
 *   loading   | drain          | draining  | start drained (an intent), or drained before it registered:
 *             |                |           |   it never registers until resumed
 *   loading   | shutdown       | stopping  | SIGTERM before the first registration
 *   loading   | engine_failed  | failed    |
 *   serving   | drain          | draining  | close admission FIRST, then unregister from discovery
 *   draining  | idle_confirmed | drained   | in-flight == 0 AND engine says idle, same generation
 *   draining  | resume         | serving   | register again, then reopen admission
 *   drained   | resume         | serving   | register again, then reopen admission
 *   draining  | drain          | draining  | idempotent
 *   drained   | drain          | drained   | idempotent
 *   serving   | resume         | serving   | idempotent (re-registers if discovery lost us)
 *   serving   | shutdown       | stopping  | SIGTERM: close admission, then unregister, grace, wait
 *   draining  | shutdown       | stopping  | SIGTERM after an Admin drain: the same wait, no grace
 *   drained   | shutdown       | stopping  |   (idem)
 *   stopping  | stopped        | stopped   | in-flight ended (or cut at the deadline), servers closed
 *   serving   | engine_failed  | failed    | the engine died: close admission, unregister, cut what
 *   draining  | engine_failed  | failed    |   runs (it cannot finish), close; exit non-zero so the
 *   drained   | engine_failed  | failed    |   supervisor restarts the worker. The same shutdown as
 *   stopping  | engine_failed  | failed    |   SIGTERM's, without grace or wait
 *   failed    | stopped        | stopped   | servers closed
 *
 * A drain whose unregister fails does not roll back: admission is closed without discovery, so the
 * worker refuses new work (retried elsewhere) and the controller keeps unregistering until
 * discovery confirms. A resume whose registration fails does not move: admission stays closed.
 * `drained` is the only deletion-safety signal; `unknown` engine idleness never reaches it.
 *
 * The controller's state is a LifecycleState (below): one value per state of this table, holding
 * what that state has, changed only by a move checked here (checkMove) or an update of its own fields.
 */

export { WORKER_STATES, type WorkerState };
export type LifecycleEvent = 'start' | 'drain' | 'resume' | 'idle_confirmed' | 'shutdown' | 'engine_failed' | 'stopped';

export const TRANSITIONS: Readonly<Record<WorkerState, Readonly<Partial<Record<LifecycleEvent, WorkerState>>>>> = {
  loading: { start: 'serving', drain: 'draining', shutdown: 'stopping', engine_failed: 'failed' },
  serving: { drain: 'draining', resume: 'serving', shutdown: 'stopping', engine_failed: 'failed' },
  draining: { drain: 'draining', resume: 'serving', idle_confirmed: 'drained', shutdown: 'stopping', engine_failed: 'failed' },
  drained: { drain: 'drained', resume: 'serving', shutdown: 'stopping', engine_failed: 'failed' },
  stopping: { stopped: 'stopped', engine_failed: 'failed' },
  failed: { stopped: 'stopped' },
  stopped: {},
};

/** States in which the worker is on its way out for good: no operation but the shutdown's own. */
export const SHUTDOWN_STATES: ReadonlySet<WorkerState> = new Set(['stopping', 'failed', 'stopped']);

export class InvalidTransition extends Error {
  constructor(
    readonly from: WorkerState,
    /** null: an update of the state's own fields, which must not change its name. */
    readonly event: LifecycleEvent | null,
    readonly to?: WorkerState,
  ) {
    super(event === null ? `an update of ${from} cannot make it ${to}` : `no transition from ${from} on ${event}${to === undefined ? '' : ` to ${to}`}`);
  }
}

export function canMove(from: WorkerState, event: LifecycleEvent): boolean {
  return TRANSITIONS[from][event] !== undefined;
}

export function nextState(from: WorkerState, event: LifecycleEvent): WorkerState {
  const to = TRANSITIONS[from][event];
  if (to === undefined) throw new InvalidTransition(from, event);
  return to;
}

/**
 * Throws InvalidTransition unless the table moves `from` on `event` to `to`; without an event
 * (null), `to` must be `from`: only the fields of the state it is in change.
 */
export function checkMove(from: WorkerState, event: LifecycleEvent | null, to: WorkerState): void {
  if ((event === null ? from : TRANSITIONS[from][event]) !== to) throw new InvalidTransition(from, event, to);
}

/**
 * The drain a worker winds down under (an Admin drain's, or the shutdown's that took it over, which
 * /engine/status still calls drain_reason): why, who asked (the audit trail's actor), and how many
 * streams it handed off at its deadline.
 */
export interface Drain {
  readonly reason: string;
  readonly actor: string;
  readonly handedOff: number;
}

/**
 * A hand-off deadline: past `at`, streams still running go to other workers. `timer` is unset
 * once it fired, and for the shutdown's own deadline (its hand-off stage keeps that time).
 */
export interface Deadline {
  readonly at: number;
  readonly timer: NodeJS.Timeout | undefined;
}

/**
 * The lifecycle's whole state, one value per state of the table: each holds what that state has,
 * and nothing of the others. Set only through the lifecycle's one setter, which checks the table.
 */
export type LifecycleState = Loading | Serving | Draining | Drained | Stopping | Failed | Stopped;

export interface Loading {
  readonly name: 'loading';
}

export interface Serving {
  readonly name: 'serving';
}

export interface Draining {
  readonly name: 'draining';
  readonly drain: Drain;
  /** When the drain was called (performance.now): the `drained` audit record spans from there. */
  readonly calledAt: number;
  /** The Admin API's `deadline_ms`: only a resume cancels it; a shutdown keeps it when it is the earlier. */
  readonly deadline: Deadline | null;
  /** The engine's last idleness answer in this drain (null until one counted). */
  readonly probe: Quiescence | null;
  /** A resume is registering: until it is done or failed, idleness does not complete the drain. */
  readonly resuming: boolean;
}

export interface Drained {
  readonly name: 'drained';
  readonly drain: Drain;
  readonly calledAt: number;
  /** Kept (and shown) until a resume or a shutdown replaces it; it hands nothing off from here. */
  readonly deadline: Deadline | null;
}

export interface Stopping {
  readonly name: 'stopping';
  /** The shutdown's: its reason and actor, with the hand-offs of the drain it took over. */
  readonly drain: Drain;
  /** The earlier of an Admin drain's deadline (its timer still armed) and the shutdown's. */
  readonly deadline: Deadline | null;
  readonly probe: Quiescence | null;
  /** Nothing in flight and the engine confirmed idle: the shutdown's wait is over. */
  readonly quiescent: boolean;
}

export interface Failed {
  readonly name: 'failed';
  /** The engine failure's message: /live fails with it. */
  readonly cause: string;
  readonly drain: Drain;
}

export interface Stopped {
  readonly name: 'stopped';
  readonly drain: Drain;
  /** Set when it stopped after its engine failed. */
  readonly cause: string | undefined;
}
