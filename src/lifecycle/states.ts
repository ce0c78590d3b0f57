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
    readonly event: LifecycleEvent,
  ) {
    super(`no transition from ${from} on ${event}`);
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
