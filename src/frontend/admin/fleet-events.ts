import type { FastifyInstance } from 'fastify';
import { Agent, request } from 'undici';
import { bearerHeader } from '../../common/admin-auth.js';
import { Backoff, pause } from '../../common/backoff.js';
import { allowOnly } from '../../common/http-server.js';
import { readSse, SseHub, sseFrame } from '../../common/sse-hub.js';
import { failureReason, identityMismatch, WORKER_ANSWER_LIMIT } from '../../common/worker-admin.js';
import type { WorkerRecord } from '../../discovery/discovery.js';
import type { ModelStats } from '../model-stats.js';
import type { FleetView } from './fleet-view.js';
import { discardBody } from '../../common/discard-body.js';

/** Reconnect back-off for a worker's status stream that ended or failed. */
const RESUBSCRIBE = { minMs: 500, maxMs: 5000, jitter: true };
/** Bound on a worker's answer to the stream request (headers); the stream itself then lasts. */
const CONNECT_TIMEOUT_MS = 2000;
/** The dashboard's window: in-flight samples older than this are dropped. */
const HISTORY_MS = 60_000;
/** Audit events kept per worker for a dashboard that opens later. */
const HISTORY_AUDIT = 50;
/** Dashboards and tools following the fleet; its own connection budget on the admin listener (see connection-budget). */
export const FLEET_STREAM_CLIENTS_MAX = 64;
export const FLEET_EVENTS_PATH = '/workers/events';

/** Workers remembered for their crashes and restarts at most (a fleet that churns ids forgets the oldest). */
const MEMORIES_MAX = 4096;

/** What a frontend remembers of a worker across its status streams: its last status, and since when it is down after a crash. */
interface WorkerMemory {
  last?: { state: string; shuttingDown: boolean; generation: number; startedAt: string | undefined } | undefined;
  /** performance.now() of the crash; undefined while it answers. */
  downSince?: number | undefined;
}

/** How often the per-model figures go out while a dashboard listens (they are rates: time is the event). */
const MODEL_STATS_EVERY_MS = 1000;
/** How often tenants' use goes out while a dashboard listens (each is a read of the limits' store, Redis when shared). */
export const TENANTS_EVERY_MS = 2000;

/**
 * GET /workers/events on the frontend's admin listener: the fleet as server-sent events. A client
 * first gets `snapshot` ({workers}: what GET /workers answers), then:
 *   worker_joined {worker}           a worker entered discovery (or came back to it)
 *   worker_left {worker_id, at}      it left discovery; still shown, as a drained worker must be
 *   worker_forgotten {worker_id}     it is gone (its system server no longer answers)
 *   status {worker_id, status, kv}   a worker's own status event (its lifecycle, in-flight, ETA), with the router's view of its cache
 *   audit {worker_id, event}         a worker's audit event (drain, resume, shutdown, hand-off), or
 *                                    one this frontend saw: `crash` (its status stream failed while it
 *                                    served, not shutting down) and `restart` (it answered again as a
 *                                    new process: another started_at), actor `frontend`
 *   worker_unreachable {worker_id, error}   its status stream failed; retried with back-off
 *   history {worker_id, inflight: [[age_ms, n]...], audit: [...]}   its last minute, once followed
 *   models {models}                  per-model request rate, errors and TTFT, every second
 *   tenants {tenants}                with --limits-file: what GET /tenants answers (use, what remains,
 *                                    limit hits), every 2 s; also in the snapshot
 * The frontend subscribes to each worker's /engine/status/events only while some client listens,
 * so an idle frontend holds no connection to any worker's admin port.
 */
export class FleetEvents {
  private readonly hub: SseHub;
  private readonly subs = new Map<string, Subscription>();
  private readonly agent = new Agent({ connect: { timeout: CONNECT_TIMEOUT_MS }, headersTimeout: CONNECT_TIMEOUT_MS, bodyTimeout: 0 });
  private statsTimer: NodeJS.Timeout | undefined;
  private tenantsTimer: NodeJS.Timeout | undefined;
  /** A report being read: the next tick waits for it rather than stacking reads on a slow store. */
  private tenantsReading = false;
  private readonly streamHeaders: Record<string, string>;
  /** Per worker id, what its last status said and whether it is down after a crash (bounded, oldest out). */
  private readonly memories = new Map<string, WorkerMemory>();

  constructor(
    app: FastifyInstance,
    private readonly fleet: FleetView,
    snapshot: () => Promise<unknown[]>,
    /** The router's view of a worker's prefix cache (as in GET /workers' `kv`). */
    private readonly kv: (workerId: string) => unknown = () => null,
    private readonly stats?: Pick<ModelStats, 'summary'>,
    workerAdminToken?: string,
    /** Tenants' limits and use (GET /tenants' answer); none without --limits-file. */
    private readonly tenants?: () => Promise<unknown>,
  ) {
    this.streamHeaders = bearerHeader(workerAdminToken);
    this.hub = new SseHub(app, () => this.unsubscribeAll(), FLEET_STREAM_CLIENTS_MAX);
    app.addHook('onClose', async () => {
      this.unsubscribeAll();
      clearInterval(this.statsTimer);
      clearInterval(this.tenantsTimer);
      await this.agent.close().catch(() => undefined);
    });
    fleet.on('joined', (record: WorkerRecord) => {
      this.hub.send('worker_joined', { worker: record });
      if (this.hub.size > 0) this.subscribe(record);
    });
    fleet.on('left', (id: string, at: number) => this.hub.send('worker_left', { worker_id: id, at: new Date(at).toISOString() }));
    fleet.on('forgotten', (id: string) => {
      this.subs.get(id)?.close();
      this.subs.delete(id);
      this.hub.send('worker_forgotten', { worker_id: id });
    });

    allowOnly(app, FLEET_EVENTS_PATH, ['GET']);
    app.get(FLEET_EVENTS_PATH, async (_req, reply) => {
      this.hub.assertRoom('fleet event streams');
      const [workers, tenants] = await Promise.all([snapshot(), this.tenants?.()]);
      const now = Date.now();
      // What the frontend already holds goes first: the page draws the last minute, not an empty chart.
      const history = [...this.subs.entries()].filter(([, sub]) => sub.hasHistory).map(([id, sub]) => sseFrame('history', { worker_id: id, ...sub.history(now) }));
      this.hub.open(reply, [sseFrame('snapshot', { workers, models: this.stats?.summary(now) ?? [], ...(tenants !== undefined && { tenants }) }), ...history]);
      for (const k of this.fleet.all()) this.subscribe(k.record);
      if (this.stats) this.statsTimer ??= setInterval(() => this.hub.send('models', { models: this.stats?.summary() ?? [] }), MODEL_STATS_EVERY_MS);
      if (this.tenants) this.tenantsTimer ??= setInterval(() => this.sendTenants(), TENANTS_EVERY_MS);
    });
  }

  private sendTenants(): void {
    if (this.tenantsReading || this.tenants === undefined) return;
    this.tenantsReading = true;
    this.tenants().then(
      (tenants) => this.hub.send('tenants', { tenants }),
      () => undefined, // the report reads the local count where the store fails; nothing to send otherwise
    ).finally(() => (this.tenantsReading = false));
  }

  private subscribe(record: WorkerRecord): void {
    const current = this.subs.get(record.worker_id);
    if (current && current.url === record.system_url) return;
    current?.close();
    // What is known of the worker outlives its subscriptions (a restart at another address, after it was forgotten): its restart is seen as one.
    let memory = this.memories.get(record.worker_id);
    if (memory === undefined) {
      this.memories.set(record.worker_id, (memory = {}));
      if (this.memories.size > MEMORIES_MAX) this.memories.delete(this.memories.keys().next().value!);
    }
    const sub = new Subscription(record, this.agent, (event, data) => this.onWorkerEvent(record.worker_id, sub, event, data), this.streamHeaders, memory);
    this.subs.set(record.worker_id, sub);
  }

  private onWorkerEvent(id: string, sub: Subscription, event: string, data: unknown): void {
    if (this.subs.get(id) !== sub) return;
    if (event === 'status') this.hub.send('status', { worker_id: id, status: data, kv: this.kv(id) });
    else if (event === 'audit') this.hub.send('audit', { worker_id: id, event: data });
    else if (event === 'history') this.hub.send('history', { worker_id: id, ...sub.history() });
    else if (event === 'error') {
      const error = String(data);
      this.hub.send('worker_unreachable', { worker_id: id, error });
      const crash = sub.crashed(error);
      if (crash !== undefined) this.hub.send('audit', { worker_id: id, event: crash });
      // A departed worker that stopped answering is gone: the fleet view forgets it (and says so).
      this.fleet.forgetIfGone(id, { reachable: false, error });
    } else if (event === 'connected') {
      const restart = sub.restarted(data);
      if (restart !== undefined) this.hub.send('audit', { worker_id: id, event: restart });
      this.fleet.forgetIfGone(id, { reachable: true, status: data as never });
    }
  }

  private unsubscribeAll(): void {
    for (const s of this.subs.values()) s.close();
    this.subs.clear();
    clearInterval(this.statsTimer);
    this.statsTimer = undefined;
    clearInterval(this.tenantsTimer);
    this.tenantsTimer = undefined;
  }
}

/**
 * One worker's status stream, reconnected with back-off until closed. Reports `status` and `audit`
 * events as they come, `history` when the worker sent its last minute, `connected` (with the first
 * status) once the worker proved its identity, and `error` (a reason) when the stream fails. Keeps
 * the worker's last minute (in-flight samples, recent audit events) for dashboards that open later.
 */
export class Subscription {
  readonly url: string;
  private readonly abort = new AbortController();
  private readonly backoff = new Backoff(RESUBSCRIBE);
  /** [ms since epoch on this clock, in-flight], oldest first. */
  private inflight: Array<[number, number]> = [];
  private audit: unknown[] = [];
  hasHistory = false;

  constructor(
    private readonly record: WorkerRecord,
    private readonly agent: Agent,
    private readonly emit: (event: string, data: unknown) => void,
    /** The admin token workers with one require on their event streams. */
    private readonly headers: Record<string, string>,
    /** What is known of the worker (its last status, a crash), shared with its later subscriptions. */
    private readonly memory: WorkerMemory = {},
  ) {
    this.url = record.system_url;
    void this.run();
  }

  close(): void {
    this.abort.abort();
  }

  /** The last minute as a `history` event carries it: ages, not times (the page's clock is not ours). */
  history(now = Date.now()): { inflight: Array<[number, number]>; audit: unknown[] } {
    while (this.inflight.length > 1 && (this.inflight[1] as [number, number])[0] <= now - HISTORY_MS) this.inflight.shift();
    return { inflight: this.inflight.map(([t, v]) => [Math.max(0, now - t), v]), audit: [...this.audit] };
  }

  private keep(event: string, data: unknown): void {
    const now = Date.now();
    if (event === 'history') {
      const h = data as { inflight?: unknown; audit?: unknown } | null;
      // The worker's own minute replaces what we had: a reconnect must not double the audit events.
      this.inflight = Array.isArray(h?.inflight) ? h.inflight.filter((p): p is [number, number] => Array.isArray(p) && typeof p[0] === 'number' && typeof p[1] === 'number').map(([age, v]) => [now - age, v]) : [];
      this.audit = Array.isArray(h?.audit) ? h.audit.slice(-HISTORY_AUDIT) : [];
      this.hasHistory = true;
    } else if (event === 'status') {
      const s = data as { inflight_requests?: unknown; state?: unknown; shutting_down?: unknown; generation?: unknown; started_at?: unknown } | null;
      const n = s?.inflight_requests;
      if (typeof n === 'number') this.inflight.push([now, n]);
      if (typeof s?.state === 'string')
        this.memory.last = { state: s.state, shuttingDown: s.shutting_down === true, generation: typeof s.generation === 'number' ? s.generation : 0, startedAt: typeof s.started_at === 'string' ? s.started_at : undefined };
      while (this.inflight.length > 1 && (this.inflight[1] as [number, number])[0] <= now - HISTORY_MS) this.inflight.shift();
    } else if (event === 'audit') {
      this.audit.push(data);
      if (this.audit.length > HISTORY_AUDIT) this.audit.shift();
    }
  }

  /**
   * Its status stream failed: a crash when it last said it served (or drained), not shutting down
   * and not stopped, told once until it answers again. The audit event it makes, or undefined.
   */
  crashed(error: string): Record<string, unknown> | undefined {
    const last = this.memory.last;
    if (this.memory.downSince !== undefined || last === undefined || last.shuttingDown || last.state === 'stopping' || last.state === 'stopped') return undefined;
    this.memory.downSince = performance.now();
    return this.remember({ what: 'crash', at: new Date().toISOString(), reason: null, actor: 'frontend', generation: last.generation, result: `unreachable while ${last.state}: ${error}`, duration_ms: 0 });
  }

  /** It answers again (its first status, `data`): a restart when it is another process than before (its started_at). */
  restarted(data: unknown): Record<string, unknown> | undefined {
    const s = data as { state?: unknown; generation?: unknown; started_at?: unknown } | null;
    const before = this.memory.last?.startedAt;
    const down = this.memory.downSince;
    this.memory.downSince = undefined;
    if (before === undefined || typeof s?.started_at !== 'string' || s.started_at === before) return undefined;
    return this.remember({
      what: 'restart',
      at: s.started_at,
      reason: null,
      actor: 'frontend',
      generation: typeof s.generation === 'number' ? s.generation : 0,
      result: `${String(s.state)} again (a new process, started ${s.started_at})`,
      duration_ms: down === undefined ? 0 : Math.round(performance.now() - down),
    });
  }

  /** An audit event this frontend made is kept with the worker's own, for dashboards that open later. */
  private remember(e: Record<string, unknown>): Record<string, unknown> {
    this.keep('audit', e);
    return e;
  }

  private async run(): Promise<void> {
    while (!this.abort.signal.aborted) {
      try {
        await this.readOnce();
        if (this.abort.signal.aborted) return;
        this.emit('error', 'status stream ended');
      } catch (err) {
        if (this.abort.signal.aborted) return;
        this.emit('error', err instanceof Error && err.name === 'IdentityError' ? err.message : failureReason(err, CONNECT_TIMEOUT_MS));
      }
      await pause(this.backoff.next(), this.abort.signal);
    }
  }

  private async readOnce(): Promise<void> {
    const res = await request(`${this.url}/engine/status/events`, { headers: this.headers, dispatcher: this.agent, signal: this.abort.signal });
    if (res.statusCode !== 200) {
      discardBody(res.body);
      throw new Error(`HTTP ${res.statusCode}`);
    }
    let first = true;
    // Bounded per event: the URL is discovery's, and whoever answers it has proved nothing yet.
    for await (const parsed of readSse(res.body, WORKER_ANSWER_LIMIT)) {
      if (first) {
        // A system port can be reused by another worker: whoever answers must be the one asked for.
        // Nothing is passed on before that: the first event must be its status.
        const answered = parsed.event === 'status' ? (parsed.data as { worker_id?: unknown } | null)?.worker_id : undefined;
        if (answered !== this.record.worker_id) {
          discardBody(res.body);
          const e = new Error(identityMismatch(this.url, answered, this.record.worker_id));
          e.name = 'IdentityError';
          throw e;
        }
        first = false;
        this.backoff.reset();
        this.emit('connected', parsed.data);
      }
      this.keep(parsed.event, parsed.data);
      this.emit(parsed.event, parsed.data);
    }
  }
}
