import type { FastifyInstance, FastifyRequest } from 'fastify';
import { createAdminGuard, DEFAULT_TOKEN_NAME } from '../common/admin-auth.js';
import { addAdminBoundary } from '../common/admin-boundary.js';
import { Gauge, Registry } from 'prom-client';
import { allowOnly, createHttpServer } from '../common/http-server.js';
import type { LifecycleStatus } from '../lifecycle/lifecycle.js';
import { DrainBodySchema, EmptyBodySchema, type DrainBody } from '../protocol/admin.js';
import { EbbError } from '../protocol/errors.js';
import type { WorkerPhase, WorkerRuntime } from './phase.js';
import { addStatusStream, STATUS_EVENTS_PATH, STATUS_STREAM_SUBSCRIBERS_MAX } from './status-stream.js';
import { addKvEventStream, KV_EVENT_SUBSCRIBERS_MAX, KV_EVENTS_PATH } from './kv-event-stream.js';
import { kvCacheStatus } from './kv-cache-status.js';
import { addAdapterRoutes } from './adapter-routes.js';
import { describeRouting } from './routed-by.js';

export interface SystemServerDeps {
  phase: WorkerPhase;
  /** Named in the KV event stream's snapshot and batches. */
  workerId: string;
  /** Guards mutating admin routes (drain, resume); returns the token's name (the audit actor). See admin-auth. */
  guardAdmin?: ((authorization: string | undefined) => string | void) | undefined;
  /** The fleet's request-plane token: it opens the event streams too (a frontend may hold only it). */
  requestToken?: string | undefined;
}

/** When this worker process started: a scale-down takes the youngest first among equals. */
const STARTED_AT = new Date(performance.timeOrigin).toISOString();

/**
 * What a scale-down ranks a worker by (see frontend/admin/victim-ranking): `eta_if_drained_ms` is the
 * drain ETA it would have if drained now (serving: from its in-flight work, 0 when idle; draining:
 * its drain ETA; null when unknown), and when it started.
 */
function scaleDownFacts(r: WorkerRuntime, s: LifecycleStatus): { started_at: string; eta_if_drained_ms: number | null } {
  let eta: number | null = s.eta_ms ?? null;
  if (s.state === 'serving') {
    const estimate = s.inflight_requests === 0 ? 0 : r.drainEta();
    eta = estimate === null ? null : Math.round(estimate);
  }
  return { started_at: STARTED_AT, eta_if_drained_ms: eta };
}

/** Whether every frontend routes to it, and it serves (registered): GET /ready, and `routed` in status. */
function routingFacts(r: WorkerRuntime, s: LifecycleStatus): { routed: boolean; routed_by: number; frontends: number } {
  const routing = r.routedBy?.routing ?? { state: 'unknown' as const };
  const frontends = routing.state === 'unknown' ? 0 : routing.frontends.length;
  const routedBy = routing.state === 'routed' ? frontends : routing.state === 'waiting' ? routing.routedBy.length : 0;
  return { routed: s.state === 'serving' && s.discovery === 'registered' && routing.state === 'routed', routed_by: routedBy, frontends };
}

/**
 * The system-status server: probes, metrics and the Admin API, on their own port so the request
 * plane never carries them. /live stays 200 while draining (drain must not get the pod killed) and
 * while the engine loads (a model can take minutes); it fails only once the engine died under the
 * worker. Until the engine can serve, /health says `loading` and the Admin API answers 503
 * `worker_loading`: there is nothing to drain, and the worker is not in discovery.
 */
export function createSystemServer({ phase, workerId, guardAdmin, requestToken }: SystemServerDeps): FastifyInstance {
  // Event streams have their own budget: 64 open streams took every admin connection (drain answered 503).
  const eventStreams = { paths: [KV_EVENTS_PATH, STATUS_EVENTS_PATH], max: KV_EVENT_SUBSCRIBERS_MAX + STATUS_STREAM_SUBSCRIBERS_MAX };
  const app = createHttpServer({ role: 'admin', bodyLimit: 64 * 1024, emptyJsonIsObject: true, eventStreams });
  // With an admin token set, reads (status, audit, event streams) are for the fleet's token holders
  // only: the admin token, or the request-plane token every frontend holds. /metrics stays open for
  // scrapers and pickers (an InferencePool's endpoint picker reads it with no credential).
  const requestGuard = createAdminGuard(requestToken, 'request-plane');
  const isRequestToken = (authorization: string | undefined): boolean => {
    try {
      return requestGuard?.(authorization) !== undefined;
    } catch {
      return false; // then the admin token's answer (401 or 403) is the one to give
    }
  };
  const readGuard = (authorization: string | undefined): void => {
    if (guardAdmin !== undefined && !isRequestToken(authorization)) guardAdmin(authorization);
  };
  addAdminBoundary(app, { tokenRequired: guardAdmin !== undefined, guardRead: guardAdmin === undefined ? undefined : readGuard, openReads: ['/metrics'] });

  const loadingRegistry = new Registry();
  new Gauge({ name: 'ebb_worker_loading', help: '1 while the worker loads its engine (not yet in discovery)', registers: [loadingRegistry] }).set(1);

  const runtime = (): WorkerRuntime => {
    const r = phase.runtime;
    if (r === undefined) throw new EbbError('worker_loading', `worker is loading its engine (${phase.lifecycle.loadingDetail}, since ${phase.lifecycle.status().state_since}); retry when /health is ready`, { headers: { 'retry-after': '5' } });
    return r;
  };
  const statusBody = (r: WorkerRuntime, s: LifecycleStatus) => {
    const kv = kvCacheStatus(r.engine);
    return { ...s, ...scaleDownFacts(r, s), ...routingFacts(r, s), overloaded: r.engine.isOverloaded(), ...r.priorityReserve?.status(), engine: r.engine.stats(), ...(kv === undefined ? {} : { kv_cache: kv }), ...(r.adapters === undefined ? {} : { adapters: r.adapters.status() }) };
  };
  /** Who is acting, for the audit trail: the admin token's name, or on an open listener the caller's address. */
  const actor = (authorization: string | undefined, ip: string): string => (guardAdmin ? guardAdmin(authorization) || DEFAULT_TOKEN_NAME : ip);
  const actorOf = (req: FastifyRequest): string => actor(req.headers.authorization, req.ip);

  allowOnly(app, '/live', ['GET']);
  app.get('/live', async (_req, reply) => {
    const { state, engineFailure } = phase.lifecycle;
    // worker_id: who answers here, so a caller can tell before it sends a token (a reused port, a stale record).
    if (engineFailure !== undefined) return reply.code(503).send({ status: 'engine_failed', state, reason: engineFailure, worker_id: workerId });
    return { status: 'alive', state, worker_id: workerId };
  });

  allowOnly(app, '/health', ['GET']);
  app.get('/health', async (_req, reply) => {
    const r = phase.runtime;
    if (r === undefined) return reply.code(503).send({ status: 'not_ready', state: phase.lifecycle.state, loading: phase.lifecycle.loadingDetail, since: phase.lifecycle.status().state_since });
    const state = r.lifecycle.state;
    const ready = state === 'serving'; // an engine failure has moved it to failed
    return reply.code(ready ? 200 : 503).send({ status: ready ? 'ready' : 'not_ready', state, discovery: r.lifecycle.discoveryPresence });
  });

  // Ready for a rollout: serving, and every frontend routes to it (their marks in discovery). A
  // Deployment's readinessProbe and `ebb rollout` use it, so an old worker is stopped only once its
  // replacement takes traffic from every frontend; /health says only that it serves.
  allowOnly(app, '/ready', ['GET']);
  app.get('/ready', async (_req, reply) => {
    const r = phase.runtime;
    if (r === undefined) return reply.code(503).send({ status: 'not_ready', state: phase.lifecycle.state, loading: phase.lifecycle.loadingDetail });
    const s = r.lifecycle.status();
    const facts = routingFacts(r, s);
    const routing = r.routedBy?.routing;
    const waiting: string[] = [];
    if (s.state !== 'serving') waiting.push(`state ${s.state}`);
    else if (s.discovery !== 'registered') waiting.push(`discovery ${s.discovery}`);
    if (routing !== undefined && routing.state !== 'routed') waiting.push(`frontends routing to it: ${describeRouting(routing)}`);
    return reply.code(facts.routed ? 200 : 503).send({ status: facts.routed ? 'ready' : 'not_ready', state: s.state, discovery: s.discovery, ...facts, waiting_for: waiting });
  });

  allowOnly(app, '/metrics', ['GET']);
  app.get('/metrics', async (_req, reply) => {
    const registry = phase.runtime?.metrics.registry ?? loadingRegistry;
    return reply.header('content-type', registry.contentType).send(await registry.metrics());
  });

  allowOnly(app, '/engine/status', ['GET']);
  app.get('/engine/status', async () => {
    const r = runtime();
    return statusBody(r, r.lifecycle.status());
  });

  allowOnly(app, '/engine/drain', ['POST']);
  app.post<{ Body: DrainBody | undefined }>('/engine/drain', { schema: { body: DrainBodySchema } }, async (req, reply) => {
    const actor = actorOf(req);
    const r = runtime();
    const status = await r.lifecycle.drain(req.body?.reason ?? 'admin', { deadlineMs: req.body?.deadline_ms, persist: req.body?.persist, actor });
    return reply.code(status.state === 'drained' ? 200 : 202).send(statusBody(r, status));
  });

  allowOnly(app, '/engine/resume', ['POST']);
  app.post('/engine/resume', { schema: { body: EmptyBodySchema } }, async (req) => {
    const actor = actorOf(req);
    const r = runtime();
    return statusBody(r, await r.lifecycle.resume({ actor }));
  });

  addAdapterRoutes(app, runtime, actor);

  allowOnly(app, '/engine/events', ['GET']);
  app.get('/engine/events', async () => ({ events: runtime().lifecycle.audit.list() }));

  addStatusStream(app, runtime, (r) => statusBody(r, r.lifecycle.status()), readGuard);
  addKvEventStream(app, workerId, runtime, readGuard);

  return app;
}
