import { ADAPTER_STATES, RESIDENT_STATES, type AdapterState } from '../protocol/adapters.js';

/**
 * One LoRA adapter's lifecycle on a worker, as one table (issue 37), in the discipline of the
 * worker's own (states.ts): the controller (worker/adapters.ts) has one setter that checks it and
 * logs every move. Admission for an adapter and its drain are ordered by this table alone: a
 * request is admitted only while its adapter is `loading` or `serving`, in the same synchronous step
 * that counts it in flight, and an unload only ever starts from `draining` with nothing in flight.
 *
 *   from      | event        | to        | what the controller does around it
 *   ----------+--------------+-----------+------------------------------------------------------------
 *   unloaded  | found        | serving   | at start, the engine holds it already (an engine server that
 *             |              |           |   loaded it before this worker process, vLLM --lora-modules)
 *   unloaded  | load         | loading   | a request for it or an admin load; a slot was free, or an
 *             |              |           |   idle one was evicted (its drain first, then this load)
 *   loading   | loaded       | serving   | the engine applies it from now; requests waiting start
 *   loading   | load_failed  | unloaded  | requests waiting are refused (retryable: tried elsewhere)
 *   loading   | drain        | draining  | the load is aborted; requests waiting are refused
 *   serving   | drain        | draining  | admission for it closes FIRST; an admin drain, an unload,
 *             |              |           |   an LRU eviction (only with nothing in flight), a worker drain
 *   draining  | unloaded     | unloaded  | its in-flight reached 0 (counted), the engine freed its slot
 *   draining  | drain        | draining  | idempotent
 *   unloaded  | drain        | unloaded  | idempotent: nothing resident
 *   loading   | load         | loading   | idempotent
 *   serving   | load         | serving   | idempotent
 *
 * A load of an adapter that is draining is refused (adapter_draining): it is retried once the
 * drain is done. `unloaded` keeps the adapter available: a later request loads it again. An
 * engine unload that fails leaves it `draining`, its slot counted (the engine may still hold it);
 * the unload is tried again by the next load that needs a slot, a request or load naming it, an
 * admin drain or unload, and a worker drain or resume (worker/adapters.ts), never lost for good.
 */

export { ADAPTER_STATES, type AdapterState };
export type AdapterEvent = 'found' | 'load' | 'loaded' | 'load_failed' | 'drain' | 'unloaded';

export const ADAPTER_TRANSITIONS: Readonly<Record<AdapterState, Readonly<Partial<Record<AdapterEvent, AdapterState>>>>> = {
  unloaded: { found: 'serving', load: 'loading', drain: 'unloaded' },
  loading: { loaded: 'serving', load_failed: 'unloaded', drain: 'draining', load: 'loading' },
  serving: { drain: 'draining', load: 'serving' },
  draining: { unloaded: 'unloaded', drain: 'draining' },
};

/** States that hold one of the engine's adapter slots: those a discovery record shows as resident. */
export const SLOT_STATES = RESIDENT_STATES;

/** Throws unless the table has the move: the setter's check (worker/adapters.ts). */
export function nextAdapterState(from: AdapterState, event: AdapterEvent): AdapterState {
  const to = ADAPTER_TRANSITIONS[from][event];
  if (to === undefined) throw new Error(`no adapter transition from ${from} on ${event}`);
  return to;
}
