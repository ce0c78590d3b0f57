/** Idle tenants remembered for what they owe at most; past it the one idle longest is forgiven (a key file can name thousands). */
export const MAX_IDLE_TENANTS = 4096;

/** What one grant charged a tenant: refunded when the turn ends without an admission. */
export interface Charge {
  readonly tenant: string;
  readonly cost: number;
}

interface Busy {
  /** Where the tenant's share ends: the virtual time its granted requests reach. */
  finish: number;
  /** Its requests in the queue (waiting, or trying a worker). */
  queued: number;
}

/**
 * Start-time fair queueing of tenants, weighted by the tokens each request asks for (its cost): a
 * tenant's next request starts where its share ends, or at the virtual time when it was idle, and
 * the request that starts first goes first, so a flood only pushes back its own tenant's requests.
 *
 * A request is charged when it is granted a turn, not when it arrives, and refunded when its turn
 * ends without an admission (no worker took it, or it left): requests never served cost their
 * tenant nothing. A tenant is held while it has requests queued; once idle, only while it owes
 * (its share ends past the virtual time: it was served lately), at most MAX_IDLE_TENANTS of
 * them. Pure: no clock, no I/O.
 */
export class FairShare {
  private vtime = 0;
  private readonly busy = new Map<string, Busy>();
  /** Idle tenants that owe, by where their share ends; the one idle longest first. */
  private readonly idle = new Map<string, number>();
  private idleAfterSweep = 0;

  /** Tenants held (queued, and idle ones that owe). */
  get size(): number {
    return this.busy.size + this.idle.size;
  }

  /** A request of `tenant` entered the queue. */
  join(tenant: string): void {
    const t = this.busy.get(tenant);
    if (t !== undefined) {
      t.queued++;
      return;
    }
    this.busy.set(tenant, { finish: this.idle.get(tenant) ?? 0, queued: 1 });
    this.idle.delete(tenant);
  }

  /** A request of `tenant` left the queue, however (a charge it had is settled before). */
  leave(tenant: string): void {
    const t = this.busy.get(tenant);
    if (t === undefined || --t.queued > 0) return;
    this.busy.delete(tenant);
    if (t.finish <= this.vtime) return;
    this.idle.set(tenant, t.finish);
    if (this.idle.size > MAX_IDLE_TENANTS) this.idle.delete(this.idle.keys().next().value!);
    if (this.idle.size > 2 * this.idleAfterSweep + 64) this.sweep();
  }

  /** Where `tenant`'s next request starts: the smaller goes first. */
  start(tenant: string): number {
    return Math.max(this.vtime, this.busy.get(tenant)?.finish ?? this.idle.get(tenant) ?? 0);
  }

  /** `tenant`'s request is granted a turn: its share moves on by `cost` tokens. */
  charge(tenant: string, cost: number): Charge {
    const start = this.start(tenant);
    const c = Math.max(1, cost);
    this.vtime = start;
    const t = this.busy.get(tenant);
    if (t !== undefined) t.finish = start + c;
    return { tenant, cost: c };
  }

  /** The turn ended without an admission: the charge is taken back. */
  refund(charge: Charge): void {
    const t = this.busy.get(charge.tenant);
    if (t !== undefined) t.finish -= charge.cost;
  }

  /** Forgets idle tenants the virtual time has passed: they owe nothing any more. */
  private sweep(): void {
    for (const [tenant, finish] of this.idle) if (finish <= this.vtime) this.idle.delete(tenant);
    this.idleAfterSweep = this.idle.size;
  }
}
