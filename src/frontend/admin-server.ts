import type { FastifyInstance } from 'fastify';
import { EventEmitter } from 'node:events';
import type { Agent } from 'undici';
import type { AdminGuard } from '../common/admin-auth.js';
import { addAdminBoundary } from '../common/admin-boundary.js';
import { DrainBodySchema, type DrainBody } from '../protocol/admin.js';
import { codeOf, EbbError } from '../protocol/errors.js';
import { allowOnly, createHttpServer, type HttpServerLimits } from '../common/http-server.js';
import { adminCall, errorMessageOf, fetchLiveStatus, identityMismatch, Unreachable, WORKER_ANSWER_LIMIT, type LiveStatus } from '../common/worker-admin.js';
import type { DiscoveryEvent, WorkerRecord } from '../discovery/discovery.js';
import type { WorkerPool } from './worker-pool.js';
import { addDashboard } from './dashboard.js';
import { FleetEvents } from './fleet-events.js';

/** How long the fleet view waits for one worker's /engine/status. */
export const STATUS_TIMEOUT_MS = 1000;
/** How long a forwarded drain or resume may take (both return once discovery has been updated). */
export const FORWARD_TIMEOUT_MS = 10_000;
/** Bound on remembered workers that left discovery (oldest forgotten first). */
export const MAX_DEPARTED = 1000;

interface Known {
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

export interface AdminServerDeps {
  fleet: FleetView;
  pool: WorkerPool;
  agent: Agent;
  /** Checks mutating routes when an admin token is configured. */
  guardAdmin?: AdminGuard | undefined;
  limits?: HttpServerLimits | undefined;
}


/**
 * The frontend's admin listener: a fleet view and drain/resume forwarded to each worker's own Admin
 * API. It stores no lifecycle state: every state shown is read live from the worker, and every
 * action is the worker's. Served on its own (loopback by default) port, never on the OpenAI port.
 */
export function createAdminServer({ fleet, pool, agent, guardAdmin, limits }: AdminServerDeps): FastifyInstance {
  const app = createHttpServer({ role: 'admin', bodyLimit: 64 * 1024, emptyJsonIsObject: true, ...limits });

  const describe = async (k: Known) => {
    const live = await fetchLiveStatus(k.record.system_url, k.record.worker_id, agent, STATUS_TIMEOUT_MS);
    const routed = pool.get(k.record.worker_id);
    const now = Date.now();
    const hold = routed?.hold && routed.hold.until > now ? routed.hold.kind : null;
    return {
      entry: {
        ...k.record,
        in_discovery: k.inDiscovery,
        left_discovery_at: k.leftAt === undefined ? null : new Date(k.leftAt).toISOString(),
        state: live.reachable ? live.status.state : null,
        // What this frontend itself has on the worker, and why it is holding it back if it is.
        routing: routed ? { inflight: routed.inflight, hold } : null,
        ...live,
      },
      live,
    };
  };

  const lookup = (id: string): Known => {
    const k = fleet.get(id);
    if (!k) throw new EbbError('worker_not_found', `no worker "${id}" is known to this frontend`);
    return k;
  };

  const listWorkers = async () => {
    const described = await Promise.all(fleet.all().map(describe));
    return described.filter(({ entry, live }) => !fleet.forgetIfGone(entry.worker_id, live)).map(({ entry }) => entry);
  };

  addAdminBoundary(app, { tokenRequired: guardAdmin !== undefined });

  allowOnly(app, '/workers', ['GET']);
  app.get('/workers', async () => ({ workers: await listWorkers() }));

  new FleetEvents(app, fleet, listWorkers);
  addDashboard(app, { tokenRequired: guardAdmin !== undefined });

  allowOnly(app, '/workers/:id', ['GET']);
  app.get<{ Params: { id: string } }>('/workers/:id', async (req) => {
    const { entry, live } = await describe(lookup(req.params.id));
    if (fleet.forgetIfGone(entry.worker_id, live))
      throw new EbbError('worker_not_found', `worker "${entry.worker_id}" left discovery and no longer answers at ${entry.system_url}: ${live.reachable ? '' : live.error}`);
    return entry;
  });

  /**
   * The system URL is whatever discovery says: before anything carrying the operator's credential
   * goes there, whoever answers it must prove to be worker `id` (a reused port, a stale or forged
   * record). Its answer is read bounded and never echoed unless it proves that.
   */
  const assertIdentity = async (k: Known, id: string): Promise<void> => {
    let res;
    try {
      res = await adminCall<{ worker_id?: unknown }>(`${k.record.system_url}/engine/status`, { agent, timeoutMs: STATUS_TIMEOUT_MS, maxBytes: WORKER_ANSWER_LIMIT });
    } catch (err) {
      throw new EbbError('worker_unreachable', `cannot reach worker ${id} at ${k.record.system_url}: ${err instanceof Unreachable ? err.reason : (err as Error).message}; nothing was forwarded`);
    }
    if (res.statusCode !== 200)
      throw new EbbError('worker_unreachable', `worker ${id} at ${k.record.system_url} answered HTTP ${res.statusCode}${codeOf(res.body) ? `: ${errorMessageOf(res.body)}` : ''}; nothing was forwarded`);
    if (res.body?.worker_id !== id) throw new EbbError('worker_identity_mismatch', `${identityMismatch(k.record.system_url, res.body?.worker_id, id)}; nothing was forwarded`);
  };

  const forward = (action: 'drain' | 'resume') => {
    allowOnly(app, `/workers/:id/${action}`, ['POST']);
    app.post<{ Params: { id: string }; Body: DrainBody | undefined }>(
      `/workers/:id/${action}`,
      { schema: action === 'drain' ? { body: DrainBodySchema } : {} },
      async (req, reply) => {
        guardAdmin?.(req.headers.authorization);
        const k = lookup(req.params.id);
        const url = `${k.record.system_url}/engine/${action}`;
        // A system port can be reused by another worker after this one left: whoever answers there
        // must prove it is the worker asked for before it gets the action, or the operator's token.
        await assertIdentity(k, req.params.id);
        const headers: Record<string, string> = {};
        if (req.headers.authorization !== undefined) headers.authorization = req.headers.authorization;
        try {
          const res = await adminCall(url, {
            method: 'POST',
            headers,
            body: action === 'drain' ? req.body : undefined,
            timeoutMs: FORWARD_TIMEOUT_MS,
            agent,
            maxBytes: WORKER_ANSWER_LIMIT,
          });
          // The worker's answer as it is: its status code, its body (a status, or its error).
          const answered = (res.body as { worker_id?: unknown } | undefined)?.worker_id;
          if (res.statusCode < 300 && answered !== req.params.id)
            throw new EbbError('worker_identity_mismatch', `${k.record.system_url} answered the ${action} as worker ${JSON.stringify(answered ?? null)}, not ${req.params.id}`);
          const challenge = res.headers['www-authenticate'];
          if (challenge !== undefined) void reply.header('www-authenticate', challenge);
          return reply.code(res.statusCode).send(res.body);
        } catch (err) {
          if (err instanceof Unreachable)
            throw new EbbError('worker_unreachable', `cannot reach worker ${k.record.worker_id} at ${k.record.system_url}: ${err.reason}`);
          throw err;
        }
      },
    );
  };
  forward('drain');
  forward('resume');

  return app;
}
