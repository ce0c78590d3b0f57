import { EventEmitter } from 'node:events';
import type { LiveStatus } from '../../common/worker-admin.js';
import type { DiscoveryEvent, WorkerRecord } from '../../discovery/discovery.js';

/** Bound on remembered workers that left discovery (oldest forgotten first). */
export const MAX_DEPARTED = 1000;

export interface Known {
  record: WorkerRecord;
  inDiscovery: boolean;
  /** When it left discovery (ms since epoch); undefined while listed. */
  leftAt?: number | undefined;
  /** Status reads that failed in a row. */
  failures: number;
}

/** Failed status reads in a row after which a worker gone from discovery is forgotten (a refused connection: at once). */
export const FORGET_AFTER_FAILURES = 3;

/**
 * Every worker this frontend has seen in discovery, including those that left it. A drained worker
 * unregisters on purpose, yet it is exactly the one an operator wants to see and resume, so the
 * fleet view remembers a departed worker for as long as its system server still answers: once a
 * listing or lookup finds a departed worker refusing connections, or failing FORGET_AFTER_FAILURES
 * reads in a row, it is forgotten (it was deleted, crashed or shut down). Re-registration under the same id makes it a listed worker again. At most
 * MAX_DEPARTED departed workers are kept. This is a view, not state: a restarted frontend only
 * knows what discovery lists now.
 */
export class FleetView extends EventEmitter {
  private readonly known = new Map<string, Known>();

  apply(event: DiscoveryEvent, now = Date.now()): void {
    if (event.type === 'reset') {
      const listed = new Set(event.records.map((r) => r.worker_id));
      for (const [id, k] of this.known) if (!listed.has(id) && k.inDiscovery) this.depart(id, now);
      for (const r of event.records) this.listed(r);
    } else if (event.type === 'put') this.listed(event.record);
    else this.depart(event.worker_id, now);
    this.bound();
  }

  /** Emits `joined` (record) for a worker new to discovery or back in it, for the fleet event stream. */
  private listed(record: WorkerRecord): void {
    const before = this.known.get(record.worker_id);
    this.known.set(record.worker_id, { record, inDiscovery: true, failures: before?.failures ?? 0 });
    if (!before?.inDiscovery || before.record.system_url !== record.system_url) this.emit('joined', record);
  }

  /** Emits `left` (id, ms): still known (a drained worker is exactly the one to see), no longer routed. */
  private depart(id: string, now: number): void {
    const k = this.known.get(id);
    if (k && k.inDiscovery) {
      this.known.set(id, { ...k, inDiscovery: false, leftAt: now });
      this.emit('left', id, now);
    }
  }

  private bound(): void {
    const departed = [...this.known.values()].filter((k) => !k.inDiscovery).sort((a, b) => (a.leftAt ?? 0) - (b.leftAt ?? 0));
    for (let i = 0; i < departed.length - MAX_DEPARTED; i++) this.forget((departed[i] as Known).record.worker_id);
  }

  all(): Known[] {
    return [...this.known.values()].sort((a, b) => a.record.worker_id.localeCompare(b.record.worker_id));
  }

  get(id: string): Known | undefined {
    return this.known.get(id);
  }

  /**
   * Records a status read; drops a departed worker whose system server refuses connections or failed
   * FORGET_AFTER_FAILURES reads in a row (one slow answer must not lose a drained worker). Workers
   * in discovery always stay.
   */
  forgetIfGone(id: string, live: LiveStatus): boolean {
    const k = this.known.get(id);
    if (!k) return false;
    if (live.reachable) {
      k.failures = 0;
      return false;
    }
    k.failures++;
    if (k.inDiscovery || (k.failures < FORGET_AFTER_FAILURES && !/ECONNREFUSED/.test(live.error))) return false;
    this.forget(id);
    return true;
  }

  /** Emits `forgotten` (id). */
  private forget(id: string): void {
    if (this.known.delete(id)) this.emit('forgotten', id);
  }
}
