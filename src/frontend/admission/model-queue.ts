import { FairShare } from './fair-share.js';
import { PREEMPTED_TENANT } from './ticket.js';
import { ServiceRate } from './service-rate.js';
import { CLASSES, type Class, type Outcome, type Waiter, type WaiterOwner, type WaiterState } from './waiter.js';

/** What a model's queue asks of the admission queue that holds it. */
export interface QueueOwner {
  /** Workers of `model` a request may be sent to now: one turn is out per routable worker. */
  routable(model: string): number;
  /** `w` left the queue (metrics, the log; a queue left empty is dropped). */
  left(q: ModelQueue, w: Waiter, outcome: Outcome): void;
  /** `w`'s queue timeout passed: it is shed with the queue's 429. */
  expire(q: ModelQueue, w: Waiter): void;
}

/** One class's waiters of one model: each tenant's in arrival order, and the tenants' fair share. */
class ClassQueue {
  readonly tenants = new Map<string, Waiter[]>();
  readonly share = new FairShare();

  add(w: Waiter): void {
    const tenant = w.ticket.tenant;
    const list = this.tenants.get(tenant);
    if (list === undefined) this.tenants.set(tenant, [w]);
    else list.push(w);
    this.share.join(tenant);
  }

  remove(w: Waiter): void {
    const tenant = w.ticket.tenant;
    const list = this.tenants.get(tenant);
    const i = list?.indexOf(w) ?? -1;
    if (i < 0) return;
    list!.splice(i, 1);
    if (list!.length === 0) this.tenants.delete(tenant);
    this.share.leave(tenant);
  }

  /**
   * The waiter whose turn is next: a preempted stream coming back first (the longest waiting), then
   * the first ready one of the tenant whose share starts first (ties: the earlier arrival).
   */
  next(ready: (w: Waiter) => boolean): Waiter | undefined {
    const back = this.tenants.get(PREEMPTED_TENANT)?.find((w) => w.ticket.preempted === true && ready(w));
    if (back !== undefined) return back;
    let best: Waiter | undefined;
    let bestStart = 0;
    for (const [tenant, list] of this.tenants) {
      const head = list.find(ready);
      if (head === undefined) continue;
      const start = this.share.start(tenant);
      if (best === undefined || start < bestStart || (start === bestStart && head.enteredAt < best.enteredAt)) {
        best = head;
        bestStart = start;
      }
    }
    return best;
  }

  /** The newest waiter not trying a worker (a flex one to shed for a higher tier); never a preempted stream coming back. */
  newest(): Waiter | undefined {
    let out: Waiter | undefined;
    for (const list of this.tenants.values()) for (const w of list) if (w.state.kind !== 'trying' && w.ticket.preempted !== true && (out === undefined || w.enteredAt > out.enteredAt)) out = w;
    return out;
  }
}

/**
 * One model's waiters, and the owner of their states. Turns are given as the fleet changes (a
 * worker registers or resumes, a slot frees, a worker says it has room), one per routable worker;
 * order: continuations, then priority, default, flex; within a class, tenants by fair share.
 *
 * A turn that finds no worker parks its waiter and passes on at once: the next waiter may need
 * what a worker has (the base model beside a busy adapter's slot). Its need is blocked until the
 * next change (others that need the same would be refused the same: they are not sent), or until a
 * waiter of that need is admitted. A change that comes while a waiter tries is counted: refused
 * after it, the waiter tries again at once instead of parking.
 */
export class ModelQueue implements WaiterOwner {
  readonly classes = new Map<Class, ClassQueue>(CLASSES.map((c) => [c, new ClassQueue()]));
  size = 0;
  trying = 0;
  readonly rate = new ServiceRate();
  /** Changes of the fleet seen: a try that began before the last one was refused on old news. */
  private changes = 0;
  /** Needs a turn found no worker for since the last change. */
  private readonly blocked = new Set<string>();
  /** Tenants whose concurrent streams a turn found all taken since the last change (a stream ending is one). */
  private readonly fullTenants = new Set<string>();

  constructor(
    readonly model: string,
    private readonly owner: QueueOwner,
  ) {}

  add(w: Waiter): void {
    this.classes.get(w.cls)!.add(w);
    this.size++;
    this.dispatch();
  }

  /** The fleet may take more of the model: every need may be tried again. */
  changed(): void {
    this.changes++;
    this.blocked.clear();
    this.fullTenants.clear();
    this.dispatch();
  }

  /** Gives turns to ready waiters while fewer are trying than there are routable workers. */
  dispatch(): void {
    if (this.size <= this.trying) return;
    // A grant only resolves a waiter's promise: nothing routes before this loop ends, so one count serves it.
    const room = this.owner.routable(this.model);
    while (this.trying < room) {
      const w = this.next();
      if (w === undefined) return;
      w.set({ kind: 'trying', since: this.changes, charge: this.classes.get(w.cls)!.share.charge(w.ticket.tenant, w.ticket.cost) });
    }
  }

  /** The newest flex waiter not trying (to shed for a higher tier in a full queue). */
  newestFlex(): Waiter | undefined {
    return this.classes.get('flex')!.newest();
  }

  private next(): Waiter | undefined {
    for (const c of CLASSES) {
      const w = this.classes.get(c)!.next(this.ready);
      if (w !== undefined) return w;
    }
    return undefined;
  }

  private readonly ready = (w: Waiter): boolean => {
    const k = w.state.kind;
    return (k === 'waiting' || k === 'parked') && !this.blocked.has(w.need) && (this.fullTenants.size === 0 || !this.fullTenants.has(w.ticket.tenant));
  };

  admit(w: Waiter): void {
    if (w.state.kind === 'gone') return;
    this.blocked.delete(w.need);
    this.rate.admitted(performance.now());
    w.set({ kind: 'gone', outcome: 'admitted' });
    this.dispatch();
  }

  refuse(w: Waiter): void {
    const s = w.state;
    if (s.kind !== 'trying') return;
    if (s.since < this.changes) w.set({ kind: 'waiting' });
    else {
      this.blocked.add(w.need);
      w.set({ kind: 'parked', need: w.need, since: this.changes });
    }
    this.dispatch();
  }

  tenantFull(w: Waiter): void {
    const s = w.state;
    if (s.kind !== 'trying') return;
    if (s.since < this.changes) w.set({ kind: 'waiting' });
    else {
      this.fullTenants.add(w.ticket.tenant);
      w.set({ kind: 'parked', need: w.need, since: this.changes });
    }
    this.dispatch();
  }

  leave(w: Waiter, outcome: Outcome, error?: unknown): void {
    const wasTrying = w.state.kind === 'trying';
    w.set({ kind: 'gone', outcome, error });
    if (wasTrying) this.dispatch();
  }

  expire(w: Waiter): void {
    this.owner.expire(this, w);
  }

  moved(w: Waiter, from: WaiterState): void {
    const to = w.state;
    const share = this.classes.get(w.cls)!.share;
    if (from.kind === 'trying') {
      this.trying--;
      // Charged at its grant; only an admission keeps the charge.
      if (!(to.kind === 'gone' && to.outcome === 'admitted')) share.refund(from.charge);
    }
    if (to.kind === 'trying') this.trying++;
    if (to.kind === 'gone') {
      this.classes.get(w.cls)!.remove(w);
      this.size--;
      this.owner.left(this, w, to.outcome);
    }
  }
}
