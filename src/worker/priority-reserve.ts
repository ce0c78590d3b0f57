import type { Admission } from '../lifecycle/admission.js';

/** An engine with at least this many batch slots keeps one for priority work unless told otherwise. */
const DEFAULT_RESERVE_FROM_SLOTS = 4;

/** --priority-reserve-slots' default: 1 where the engine has >= 4 batch slots, else none (a small batch would lose too much). */
export function defaultPriorityReserve(batchSlots: number): number {
  return batchSlots >= DEFAULT_RESERVE_FROM_SLOTS ? 1 : 0;
}

/**
 * Headroom for priority work: a `flex` request is admitted only while the engine has a free batch
 * slot beyond `reserve`, so a priority (or default) request finds a slot at once instead of waiting
 * behind flex work the engine already holds. Counted from the worker's own admissions (several
 * frontends read the same answer from its status). An engine that does not say its batch slots
 * (0: an engine server's own scheduler) keeps no reserve.
 */
export class PriorityReserve {
  constructor(
    private readonly batchSlots: () => number,
    readonly reserve: number,
    private readonly admission: Pick<Admission, 'inflight'>,
  ) {}

  /** Would a flex request be admitted now? */
  get flexRoom(): boolean {
    return this.flexRoomIn(this.batchSlots());
  }

  /** What /engine/status and its event stream say of it: frontends give flex a turn only on flex_room. */
  status(): { free_slots: number; priority_reserve_slots: number; flex_room: boolean } {
    const slots = this.batchSlots();
    return { free_slots: Math.max(0, slots - this.admission.inflight), priority_reserve_slots: this.reserve, flex_room: this.flexRoomIn(slots) };
  }

  private flexRoomIn(slots: number): boolean {
    return slots === 0 || this.admission.inflight < slots - this.reserve;
  }
}
