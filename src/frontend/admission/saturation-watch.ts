import type { Logger } from 'pino';
import { Agent } from 'undici';
import { bearerHeader } from '../../common/admin-auth.js';
import type { WorkerRecord } from '../../discovery/discovery.js';
import { Subscription } from '../admin/fleet-events.js';
import type { WorkerPool } from '../routing/worker-pool.js';

/** Bound on a worker's answer to the stream request (headers); the stream itself then lasts. */
const CONNECT_TIMEOUT_MS = 2000;

/**
 * Saturation is the worker's own word. Once a worker refuses a request (full, or draining: a resumed
 * worker is in discovery a moment before its admission reopens), this frontend follows that
 * worker's status stream (GET /engine/status/events, pushed on every transition and in-flight
 * change) for as long as it is in discovery: `overloaded: true` holds it out before anything is sent
 * to it, for as long as it says so (its stream breaking ends that); admission open and not
 * overloaded ends the hold and gives queued requests their turn at once; after a flex refusal, `flex_room` and `free_slots` beyond `priority_reserve_slots` say how
 * many queued flex requests it would take now. Each frontend reads the same counts from the worker, so several frontends agree on who is
 * full (no frontend counts alone); a frontend whose requests were never refused holds no such stream.
 */
export class SaturationWatch {
  private readonly subs = new Map<string, Subscription>();
  private readonly agent = new Agent({ connect: { timeout: CONNECT_TIMEOUT_MS }, headersTimeout: CONNECT_TIMEOUT_MS, bodyTimeout: 0 });
  private readonly headers: Record<string, string>;

  constructor(
    private readonly pool: WorkerPool,
    /** The token workers' event streams need where they have one (the request-plane token opens them too). */
    token: string | undefined,
    private readonly log: Logger,
  ) {
    this.headers = bearerHeader(token);
    pool.onRefused = (record) => this.follow(record);
  }

  private follow(record: WorkerRecord): void {
    const current = this.subs.get(record.worker_id);
    if (current?.url === record.system_url) return;
    current?.close();
    const sub = new Subscription(record, this.agent, (event, data) => this.onEvent(record.worker_id, sub, event, data), this.headers);
    this.subs.set(record.worker_id, sub);
  }

  /** Out of discovery (drained, gone): a registration brings it back, and a refusal follows it again. */
  forget(id: string): void {
    this.subs.get(id)?.close();
    this.subs.delete(id);
  }

  private onEvent(id: string, sub: Subscription, event: string, data: unknown): void {
    if (this.subs.get(id) !== sub) return;
    if (this.pool.get(id) === undefined) return this.forget(id);
    if (event === 'error') return this.pool.wordLost(id);
    if (event !== 'status' && event !== 'connected') return;
    const status = data as { overloaded?: unknown; admission_open?: unknown; flex_room?: unknown; free_slots?: unknown; priority_reserve_slots?: unknown } | null;
    if (status?.overloaded === true) {
      if (this.pool.holdFull(id)) this.log.info({ event: 'worker_full', worker_id: id }, `worker ${id} says it is full: nothing is sent to it until it says it has room`);
    } else if (status?.overloaded === false && status.admission_open === true) this.pool.roomAgain(id);
    if (typeof status?.flex_room === 'boolean') this.pool.flexRoom(id, status.flex_room && status.admission_open === true ? flexSlots(status.free_slots, status.priority_reserve_slots) : 0);
  }

  async close(): Promise<void> {
    for (const s of this.subs.values()) s.close();
    this.subs.clear();
    await this.agent.close().catch(() => undefined);
  }
}

/** Free slots beyond the reserve (at least one where the worker says flex_room without the counts). */
function flexSlots(free: unknown, reserve: unknown): number {
  return typeof free === 'number' && typeof reserve === 'number' ? Math.max(1, free - reserve) : 1;
}
