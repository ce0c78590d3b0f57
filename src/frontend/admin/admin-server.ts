import type { FastifyInstance } from 'fastify';
import type { Agent } from 'undici';
import { bearerHeader, type AdminGuard } from '../../common/admin-auth.js';
import { addAdminBoundary } from '../../common/admin-boundary.js';
import { DrainBodySchema, type DrainBody } from '../../protocol/admin.js';
import { AdapterDrainBodySchema, type AdapterDrainBody } from '../../protocol/adapters.js';
import { codeOf, EbbError } from '../../protocol/errors.js';
import { allowOnly, createHttpServer, type HttpServerLimits } from '../../common/http-server.js';
import { adminCall, errorMessageOf, fetchLiveStatus, identityAt, identityMismatch, Unreachable, WORKER_ANSWER_LIMIT, type LiveStatus } from '../../common/worker-admin.js';
import type { DiscoveryEvent, WorkerRecord } from '../../discovery/discovery.js';
import type { DrainIntent, DrainIntentStore } from '../../discovery/drain-intent.js';
import type { ScaleDownLocks } from '../../discovery/scale-down-lock.js';
import type { ModelStats } from '../model-stats.js';
import type { WorkerPool } from '../routing/worker-pool.js';
import { addDashboard, DASHBOARD_OPEN_PATHS } from './dashboard.js';
import { FLEET_EVENTS_PATH, FLEET_STREAM_CLIENTS_MAX, FleetEvents } from './fleet-events.js';
import type { FleetView, Known } from './fleet-view.js';
import { fleetCapacity } from './fleet-capacity.js';
import { addScaleDownRoute } from './scale-down-route.js';
import { registerFleetMetrics } from '../metrics.js';
import type { Registry } from 'prom-client';

/** How long the fleet view waits for one worker's /engine/status. */
export const STATUS_TIMEOUT_MS = 1000;
/** How long a forwarded drain or resume may take (both return once discovery has been updated). */
export const FORWARD_TIMEOUT_MS = 10_000;

export interface AdminServerDeps {
  fleet: FleetView;
  pool: WorkerPool;
  /** The router's view of a worker (its indexed blocks, queued prefill), for /workers and the dashboard. */
  kv?: ((workerId: string) => Record<string, unknown> | null) | undefined;
  /**
   * Discovery's drain intents, where it keeps them (etcd): a worker that started drained under one
   * never registered, and its intent is how the fleet view still lists and reaches it.
   */
  intents?: DrainIntentStore | undefined;
  /** Discovery's scale-down lock: one scale-down of a model at a time, with every CLI and frontend on it. */
  scaleDownLocks: ScaleDownLocks;
  /** Per-model request rate, errors and TTFT, for the dashboard. */
  stats?: Pick<ModelStats, 'summary'> | undefined;
  agent: Agent;
  /** Checks every route but the probes and the dashboard's page when an admin token is configured. */
  guardAdmin?: AdminGuard | undefined;
  /** Presented to workers' status reads and event streams, which require a token where the worker has one. */
  workerAdminToken?: string | undefined;
  limits?: HttpServerLimits | undefined;
  /** Where the fleet's capacity gauges (per model, for an autoscaler) and scale-down counts go: the frontend's /metrics. */
  metricsRegistry?: Registry | undefined;
  /** Tenants' limits and use (--limits-file): GET /tenants, `ebb tenants` and the dashboard read it. */
  tenants?: (() => Promise<unknown>) | undefined;
}

/**
 * The frontend's admin listener: a fleet view and drain/resume forwarded to each worker's own Admin
 * API. It stores no lifecycle state: every state shown is read live from the worker, and every
 * action is the worker's. Served on its own (loopback by default) port, never on the OpenAI port.
 */
export function createAdminServer({ fleet, pool, kv, intents, scaleDownLocks, stats, agent, guardAdmin, workerAdminToken, limits, metricsRegistry, tenants }: AdminServerDeps): FastifyInstance {
  // Dashboards' streams have their own connection budget: they never take the drain button's room.
  const eventStreams = { paths: [FLEET_EVENTS_PATH], max: FLEET_STREAM_CLIENTS_MAX };
  const app = createHttpServer({ role: 'admin', bodyLimit: 64 * 1024, emptyJsonIsObject: true, ...limits, eventStreams });

  /** Intents by worker id; an unreachable store lists none (the fleet view still answers). */
  const readIntents = async (): Promise<Map<string, DrainIntent>> => (intents ? await intents.list().catch(() => new Map<string, DrainIntent>()) : new Map<string, DrainIntent>());
  /** Workers known only from their intent's record: started drained, never registered. */
  const unregistered = (held: Map<string, DrainIntent>): Known[] =>
    [...held.values()].flatMap((i) => (i.worker !== undefined && !fleet.get(i.worker.worker_id) ? [{ record: i.worker, inDiscovery: false, failures: 0 }] : []));

  const describe = async (k: Known, intent?: DrainIntent) => {
    const live = await fetchLiveStatus(k.record.system_url, k.record.worker_id, agent, STATUS_TIMEOUT_MS, { token: workerAdminToken });
    const routed = pool.get(k.record.worker_id);
    const now = Date.now();
    const hold = routed?.hold && routed.hold.until > now ? routed.hold.kind : null;
    return {
      entry: {
        ...k.record,
        in_discovery: k.inDiscovery,
        left_discovery_at: k.leftAt === undefined ? null : new Date(k.leftAt).toISOString(),
        state: live.reachable ? live.status.state : null,
        // What this frontend itself has on the worker (all its processes), and why it is holding it back if it is.
        routing: routed ? { inflight: routed.load, hold } : null,
        // The router's index of its prefix cache: cached_blocks, exact (KV events) or approximate; kept masked while it is out of discovery.
        kv: kv?.(k.record.worker_id) ?? null,
        ...live,
        ...(intent ? { drain_intent: intent } : {}),
      },
      live,
    };
  };

  const lookup = async (id: string): Promise<Known> => {
    const known = fleet.get(id);
    if (known) return known;
    const intent = await intents?.get(id).catch(() => undefined);
    if (intent?.worker?.worker_id === id) return { record: intent.worker, inDiscovery: false, failures: 0 };
    throw new EbbError('worker_not_found', `no worker "${id}" is known to this frontend`);
  };

  const listWorkers = async () => {
    const held = await readIntents();
    const [listed, fromIntents] = await Promise.all([
      Promise.all(fleet.all().map((k) => describe(k, held.get(k.record.worker_id)))),
      // Shown while their system server answers as them; the fleet view does not keep them.
      Promise.all(unregistered(held).map((k) => describe(k, held.get(k.record.worker_id)))),
    ]);
    return [
      ...listed.filter(({ entry, live }) => !fleet.forgetIfGone(entry.worker_id, live)).map(({ entry }) => entry),
      ...fromIntents.filter(({ live }) => live.reachable).map(({ entry }) => entry),
    ].sort((a, b) => a.worker_id.localeCompare(b.worker_id));
  };

  // With a token, reads need it too (the fleet view names every worker and its internal URLs); the
  // dashboard's page loads without it and asks for it before it reads anything.
  addAdminBoundary(app, { tokenRequired: guardAdmin !== undefined, guardRead: guardAdmin, openReads: DASHBOARD_OPEN_PATHS });
  const scaleDowns = metricsRegistry ? registerFleetMetrics(metricsRegistry, async () => fleetCapacity(await listWorkers())).scaleDown : undefined;

  allowOnly(app, '/workers', ['GET']);
  app.get('/workers', async () => ({ workers: await listWorkers() }));

  new FleetEvents(app, fleet, listWorkers, (id) => kv?.(id) ?? null, stats, workerAdminToken, tenants);
  addDashboard(app, {
    tokenRequired: guardAdmin !== undefined,
    snapshot: async () => {
      const [workers, tenantsNow] = await Promise.all([listWorkers(), tenants?.()]);
      return { workers, models: stats?.summary() ?? [], ...(tenantsNow !== undefined && { tenants: tenantsNow }) };
    },
  });

  // Without --limits-file nothing is counted: an empty list says so (store none).
  allowOnly(app, '/tenants', ['GET']);
  app.get('/tenants', async () => (tenants === undefined ? { store: 'none', tenants: [] } : await tenants()));

  allowOnly(app, '/workers/:id', ['GET']);
  app.get<{ Params: { id: string } }>('/workers/:id', async (req) => {
    const { entry, live } = await describe(await lookup(req.params.id));
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
    const url = k.record.system_url;
    let said: unknown;
    try {
      // Its open /live says who it is (no credential goes out for that); a worker older than that says it in its status.
      said = await identityAt(url, agent, STATUS_TIMEOUT_MS);
      if (said === undefined) {
        const res = await adminCall<{ worker_id?: unknown }>(`${url}/engine/status`, { agent, timeoutMs: STATUS_TIMEOUT_MS, maxBytes: WORKER_ANSWER_LIMIT, headers: bearerHeader(workerAdminToken) });
        if (res.statusCode !== 200)
          throw new EbbError('worker_unreachable', `worker ${id} at ${url} answered HTTP ${res.statusCode}${codeOf(res.body) ? `: ${errorMessageOf(res.body)}` : ''}; nothing was forwarded`);
        said = res.body?.worker_id;
      }
    } catch (err) {
      if (err instanceof EbbError) throw err;
      throw new EbbError('worker_unreachable', `cannot reach worker ${id} at ${url}: ${err instanceof Unreachable ? err.reason : (err as Error).message}; nothing was forwarded`);
    }
    if (said !== id) throw new EbbError('worker_identity_mismatch', `${identityMismatch(url, said, id)}; nothing was forwarded`);
  };

  /**
   * Sends `action` to worker `id` with the caller's credential, once whoever answers at its system URL
   * proved to be that worker. Resolves with the worker's answer as it is (status code, body).
   */
  const forwardAction = async (id: string, action: 'drain' | 'resume', body: DrainBody | undefined, authorization: string | undefined) => {
    const k = await lookup(id);
    const url = `${k.record.system_url}/engine/${action}`;
    // A system port can be reused by another worker after this one left: whoever answers there
    // must prove it is the worker asked for before it gets the action, or the operator's token.
    await assertIdentity(k, id);
    const headers: Record<string, string> = {};
    if (authorization !== undefined) headers.authorization = authorization;
    try {
      const res = await adminCall(url, {
        method: 'POST',
        headers,
        body: action === 'drain' ? body : undefined,
        timeoutMs: FORWARD_TIMEOUT_MS,
        agent,
        maxBytes: WORKER_ANSWER_LIMIT,
      });
      const answered = (res.body as { worker_id?: unknown } | undefined)?.worker_id;
      if (res.statusCode < 300 && answered !== id)
        throw new EbbError('worker_identity_mismatch', `${k.record.system_url} answered the ${action} as worker ${JSON.stringify(answered ?? null)}, not ${id}`);
      return res;
    } catch (err) {
      if (err instanceof Unreachable) throw new EbbError('worker_unreachable', `cannot reach worker ${k.record.worker_id} at ${k.record.system_url}: ${err.reason}`);
      throw err;
    }
  };

  const forward = (action: 'drain' | 'resume') => {
    allowOnly(app, `/workers/:id/${action}`, ['POST']);
    app.post<{ Params: { id: string }; Body: DrainBody | undefined }>(
      `/workers/:id/${action}`,
      { schema: action === 'drain' ? { body: DrainBodySchema } : {} },
      async (req, reply) => {
        guardAdmin?.(req.headers.authorization);
        const res = await forwardAction(req.params.id, action, req.body, req.headers.authorization);
        // The worker's answer as it is: its status code, its body (a status, or its error).
        const challenge = res.headers['www-authenticate'];
        if (challenge !== undefined) void reply.header('www-authenticate', challenge);
        return reply.code(res.statusCode).send(res.body);
      },
    );
  };
  forward('drain');
  forward('resume');

  // One LoRA adapter's drain on one worker (the dashboard's adapter rows), forwarded as a worker's
  // drain is: to whoever proved to be that worker, with the caller's credential; its answer as it is.
  allowOnly(app, '/workers/:id/adapters/:name/drain', ['POST']);
  app.post<{ Params: { id: string; name: string }; Body: AdapterDrainBody | undefined }>('/workers/:id/adapters/:name/drain', { schema: { body: AdapterDrainBodySchema } }, async (req, reply) => {
    guardAdmin?.(req.headers.authorization);
    const k = await lookup(req.params.id);
    await assertIdentity(k, req.params.id);
    const headers: Record<string, string> = {};
    if (req.headers.authorization !== undefined) headers.authorization = req.headers.authorization;
    try {
      const res = await adminCall(`${k.record.system_url}/engine/adapters/${encodeURIComponent(req.params.name)}/drain`, { method: 'POST', headers, body: req.body ?? {}, timeoutMs: FORWARD_TIMEOUT_MS, agent, maxBytes: WORKER_ANSWER_LIMIT });
      return reply.code(res.statusCode).send(res.body);
    } catch (err) {
      if (err instanceof Unreachable) throw new EbbError('worker_unreachable', `cannot reach worker ${k.record.worker_id} at ${k.record.system_url}: ${err.reason}`);
      throw err;
    }
  });

  addScaleDownRoute(app, { listWorkers, forwardAction, locks: scaleDownLocks, guardAdmin, counter: scaleDowns });

  return app;
}
