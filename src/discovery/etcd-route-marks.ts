import type { Etcd3, Lease, Watcher } from 'etcd3';
import { Backoff, pause } from '../common/backoff.js';
import { bounded } from './guards.js';
import { parseRouteMark, type RouteMark, type RouteMarks } from './route-marks.js';

/** Beside the instance records (`/ebb/v1/instances/`), not under them: frontends watch that prefix. */
export const ROUTES_PREFIX = '/ebb/v1/routes/';
const CLOSE_BOUND_MS = 2000;
/**
 * A mark's lease: a frontend gone without closing (a crash, a partition) stops counting this long
 * after, so a rollout waits at most this for a dead frontend; a frontend cut off from etcd for
 * less keeps its mark, and a worker it cannot see yet is not ready.
 */
export const ROUTE_MARK_TTL_S = 20;
const REPUT_RETRY = { minMs: 250, maxMs: 5000, jitter: true };

const keyOf = (frontendId: string) => `${ROUTES_PREFIX}${encodeURIComponent(frontendId)}`;

/**
 * etcd's marks: one key per frontend, on a lease of this process's own that the client keeps
 * alive, so a frontend that dies stops counting within ROUTE_MARK_TTL_S. A lost lease (etcd unreachable
 * past it) is put again, on a fresh lease, once etcd answers.
 */
export class EtcdRouteMarks implements RouteMarks {
  private lease: Lease | undefined;
  private readonly held = new Map<string, RouteMark>();
  private closed = false;
  private reputting = false;
  private readonly stop = new AbortController();

  constructor(
    private readonly client: Etcd3,
    private readonly ttlS = ROUTE_MARK_TTL_S,
  ) {}

  private currentLease(): Lease {
    if (this.lease && !this.lease.revoked()) return this.lease;
    const lease = this.client.lease(this.ttlS);
    lease.on('lost', () => {
      if (this.lease === lease) this.lease = undefined;
      void this.reputAll();
    });
    this.lease = lease;
    return lease;
  }

  private async reputAll(): Promise<void> {
    if (this.closed || this.reputting) return;
    this.reputting = true;
    const backoff = new Backoff(REPUT_RETRY);
    try {
      while (!this.closed && this.held.size > 0) {
        try {
          for (const mark of [...this.held.values()]) await this.put(mark);
          return;
        } catch {
          if (!(await pause(backoff.next(), this.stop.signal))) return;
        }
      }
    } finally {
      this.reputting = false;
    }
  }

  private async put(mark: RouteMark): Promise<void> {
    await this.currentLease().put(keyOf(mark.frontend_id)).value(JSON.stringify(mark)).exec();
  }

  async publish(mark: RouteMark): Promise<void> {
    this.held.set(mark.frontend_id, mark);
    await this.put(mark);
  }

  async withdraw(frontendId: string): Promise<void> {
    this.held.delete(frontendId);
    await this.client.delete().key(keyOf(frontendId)).exec();
  }

  async list(): Promise<RouteMark[]> {
    const all = await this.client.getAll().prefix(ROUTES_PREFIX).strings();
    const marks: RouteMark[] = [];
    for (const raw of Object.values(all)) {
      try {
        const m = parseRouteMark(JSON.parse(raw));
        if (m !== undefined) marks.push(m);
      } catch {
        // someone else's junk under the prefix
      }
    }
    return marks;
  }

  async watch(changed: () => void): Promise<{ close(): Promise<void> }> {
    const watcher: Watcher = this.client.watch().prefix(ROUTES_PREFIX).watcher();
    let disconnected = false;
    watcher.on('put', changed);
    watcher.on('delete', changed);
    watcher.on('disconnected', () => (disconnected = true));
    // Back after an outage: what changed meanwhile is read whole.
    watcher.on('connected', () => {
      if (disconnected) changed();
      disconnected = false;
    });
    watcher.on('error', () => changed());
    return { close: () => bounded(watcher.cancel(), CLOSE_BOUND_MS) };
  }

  async close(): Promise<void> {
    this.closed = true;
    this.stop.abort();
    const lease = this.lease;
    this.lease = undefined;
    // Revoked, the marks go now instead of after the TTL.
    if (lease) await bounded(lease.revoke(), CLOSE_BOUND_MS).catch(() => undefined);
  }
}
