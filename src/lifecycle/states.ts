/**
 * The worker lifecycle, as one table. Side effects belong to the controller (lifecycle.ts);
 * this file only says which moves exist.
 *
 *   from      | event             | to        | what the controller does around it
 *   ----------+-------------------+-----------+-----------------------------------------------------
 *   serving   | drain             | draining  | close admission FIRST, then unregister from discovery
 *   draining  | unregister_failed | serving   | rollback: reopen admission, report the error
 *   draining  | idle_confirmed    | drained   | in-flight == 0 AND engine says idle, same generation
 *   draining  | resume            | serving   | register again, then reopen admission
 *   drained   | resume            | serving   | register again, then reopen admission
 *   draining  | drain             | draining  | idempotent
 *   drained   | drain             | drained   | idempotent
 *   serving   | resume            | serving   | idempotent (re-registers if discovery lost us)
 *
 * A resume whose registration fails does not move: admission stays closed and the state stays.
 * `drained` is the only deletion-safety signal; `unknown` engine idleness never reaches it.
 */

export type WorkerState = 'serving' | 'draining' | 'drained';
export type LifecycleEvent = 'drain' | 'resume' | 'unregister_failed' | 'idle_confirmed';

export const TRANSITIONS: Readonly<Record<WorkerState, Readonly<Partial<Record<LifecycleEvent, WorkerState>>>>> = {
  serving: { drain: 'draining', resume: 'serving' },
  draining: { drain: 'draining', resume: 'serving', unregister_failed: 'serving', idle_confirmed: 'drained' },
  drained: { drain: 'drained', resume: 'serving' },
};

export const WORKER_STATES: readonly WorkerState[] = ['serving', 'draining', 'drained'];

export class InvalidTransition extends Error {
  constructor(readonly from: WorkerState, readonly event: LifecycleEvent) {
    super(`no transition from ${from} on ${event}`);
  }
}

export function nextState(from: WorkerState, event: LifecycleEvent): WorkerState {
  const to = TRANSITIONS[from][event];
  if (to === undefined) throw new InvalidTransition(from, event);
  return to;
}
