import cors from '@fastify/cors';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { Logger } from 'pino';
import type { AdminGuard } from '../../common/admin-auth.js';
import { allowOnly, createHttpServer, type HttpServerLimits } from '../../common/http-server.js';
import { HERMES_SYNTAX } from '../../protocol/tools.js';
import { toPeer } from '../cluster/peer-proxy.js';
import type { FrontendMetrics } from '../metrics.js';
import { createRelay } from '../relay/relay.js';
import type { Upstream } from '../relay/upstream.js';
import type { WorkerPool } from '../routing/worker-pool.js';
import { Shutdown } from '../shutdown.js';
import { addResumeRoutes } from '../streams/resume-routes.js';
import type { StreamStore } from '../streams/stream-store.js';
import { embedTokens, requestTier, tagEmbedTicket, tagTickets, tenantOf } from '../admission/ticket.js';
import type { TenantLimiter } from '../limits/limiter.js';
import { countsTokens } from '../limits/tenant-limits.js';
import { outcomeOf } from '../request-outcome.js';
import { tracing } from '../../tracing/tracing.js';
import { traceBodies, traceHttpRequest, TRACEPARENT } from '../../tracing/request-trace.js';
import { addCompletionRoutes, storedWhenTakenOver } from './completions-route.js';
import type { CompletionStore } from './completion-store.js';
import { MemoryCompletionStore } from './completion-store.js';
import { RedisCompletionStore } from './completion-store-redis.js';
import { addEmbeddingsRoute } from './embeddings-route.js';
import { checkFields } from './field-policy.js';
import { isOwnId } from './id-routes.js';
import { DEFAULT_MAX_LANES_PER_REQUEST, LaneBudget } from './lane-budget.js';
import { addModelRoutes } from './model-routes.js';
import { requestIdOf } from './request-id.js';
import { responseIds } from './response-ids.js';
import { ResponseStore } from './response-store.js';
import { addResponsesRoutes } from './responses-routes.js';
import { addStoredCompletionRoutes } from './stored-completions-routes.js';
import type { RouteContext } from './route-context.js';
import { servedAs } from './served-model.js';
import { ebbTier } from './service-tier.js';
import { createStreamOut, RESUMABLE_HEADER } from './stream-out.js';
import { toolKey } from './stream-plan.js';

export interface OpenAIServerDeps {
  pool: WorkerPool;
  upstream: Upstream;
  metrics: FrontendMetrics;
  log: Logger;
  limits?: HttpServerLimits | undefined;
  /** How many times one request may move to another worker mid-stream (default 3; 0 disables). */
  migrationLimit?: number | undefined;
  /** How many times a flex stream may be paused for a priority request (default 2; 0: never). */
  preemptionLimit?: number | undefined;
  /** A streaming client that reads nothing this long is disconnected (default 30 s; 0: never). */
  clientWriteTimeoutMs?: number | undefined;
  /** Origins browsers may call from (CORS); none by default. `*` allows any. */
  corsOrigins?: string[] | undefined;
  /** /health answers 200 even when no worker can take a request (default: 503 until one can). */
  healthReadyWithoutWorkers?: boolean | undefined;
  /** Sequences per request and file descriptors across requests (default: 128 per request, no fd bound). */
  lanes?: LaneBudget | undefined;
  /** Readiness on the way out, and what ends the requests still open at the shutdown deadline. */
  shutdown?: Shutdown | undefined;
  /** Client API keys (--api-key-file): every /v1/ route needs one. None: the public API is open. */
  apiGuard?: AdminGuard | undefined;
  /** One process of several serving this port: its slot goes in a header, /metrics is the whole frontend's, ids name it. */
  cluster?: { slot: number; scrape: () => Promise<string>; peerUrl?: ((slot: number) => string | undefined) | undefined } | undefined;
  /** Where streams are kept for resumption (--stream-store); none: streams end with their connection, as before. */
  streams?: StreamStore | undefined;
  /** Which streams are kept: those whose client asks (x-ebb-resumable: 1; the default), or all (--keep-streams all). Background responses always are. */
  keepStreams?: 'resumable' | 'all' | undefined;
  /** Requests no worker can take now wait (--queue-timeout); none: 503 at once, as before. */
  queueing?: boolean | undefined;
  /** Tenants' limits (--limits-file); none: nothing is counted. */
  limiter?: TenantLimiter | undefined;
  /** A worker's tokens of a prompt (POST /v1/responses/input_tokens); none: that route answers 503. */
  tokenize?: RouteContext['tokenize'];
}

export const DEFAULT_MIGRATION_LIMIT = 3;

/** The public OpenAI-compatible API: the server, its hooks, and what its routes share. No admin route lives here. */
export function createOpenAIServer({
  pool,
  upstream,
  metrics,
  log,
  limits,
  migrationLimit = DEFAULT_MIGRATION_LIMIT,
  preemptionLimit,
  clientWriteTimeoutMs,
  corsOrigins = [],
  healthReadyWithoutWorkers = false,
  lanes = new LaneBudget(DEFAULT_MAX_LANES_PER_REQUEST, undefined),
  shutdown = new Shutdown(),
  apiGuard,
  cluster,
  streams,
  keepStreams = 'resumable',
  queueing = false,
  limiter,
  tokenize,
}: OpenAIServerDeps): FastifyInstance {
  const app = createHttpServer({ role: 'public', ...limits });
  // On the raw response: streams write their head themselves, and writeHead keeps what setHeader set.
  // A callback hook: an async one costs every request a promise for synchronous work.
  const slot = cluster === undefined ? undefined : String(cluster.slot);
  app.addHook('onRequest', (req, reply, done) => {
    reply.raw.setHeader('x-request-id', requestIdOf(req.headers['x-request-id']));
    if (slot !== undefined) reply.raw.setHeader('x-ebb-frontend-process', slot);
    done();
  });
  // Tracing on: each public API request's span (the client's traceparent its parent, its own in the answer).
  if (tracing() !== undefined) {
    app.addHook('onRequest', (req, reply, done) => {
      if (req.url.startsWith('/v1/')) traceHttpRequest(req.raw, reply.raw, req.routeOptions.url ?? req.url.split('?')[0]!, reply.raw.getHeader('x-request-id') as string | undefined);
      done();
    });
  }
  lanes.watch(app.server);
  if (apiGuard !== undefined) {
    // /live, /health and /metrics stay open: probes and scrapers carry no key; CORS preflights neither.
    app.addHook('onRequest', async (req) => {
      if (req.url.startsWith('/v1/') && req.method !== 'OPTIONS') apiGuard(req.headers.authorization);
    });
  }
  const relay = createRelay({ upstream, metrics, log, migrationLimit, preemptionLimit, clientWriteTimeoutMs });
  if (corsOrigins.length > 0) {
    // Registered before the routes so the preflight (OPTIONS) is answered for each of them.
    void app.register(cors, { origin: corsOrigins.includes('*') ? true : corsOrigins, methods: ['GET', 'POST', 'DELETE'], maxAge: 600, exposedHeaders: ['x-request-id', 'x-ebb-worker-id', RESUMABLE_HEADER, TRACEPARENT] });
  }
  // Counted once the response closes (finished, failed, or its client gone), by what the body asked
  // for. A callback hook: an async one costs every request a promise for synchronous work.
  app.addHook('onRequest', (req, reply, done) => {
    const url = req.routeOptions.url;
    // POST: a generation (GET /v1/chat/completions lists stored ones).
    if (req.method === 'POST' && (url === '/v1/chat/completions' || url === '/v1/completions' || url === '/v1/responses' || url === '/v1/embeddings')) {
      const started = performance.now();
      reply.raw.once('close', () => {
        const body = req.body as { model?: unknown; service_tier?: unknown } | undefined;
        const named = typeof body?.model === 'string' ? body.model : undefined;
        // A label only for a model the fleet knows: a client's typo is no series of its own.
        const model = named !== undefined && (pool.knows(named) || pool.adapterBase(named) !== undefined) ? named : undefined;
        const res = reply.raw;
        metrics.request(url, res.statusCode, model, model === undefined ? undefined : { tier: requestTier(ebbTier(body?.service_tier), req.headers), tenant: tenantOf(req.headers, apiGuard), outcome: outcomeOf(res), seconds: (performance.now() - started) / 1000 });
      });
    }
    done();
  });
  const methods = (url: string, allowed: Array<'GET' | 'POST' | 'DELETE'>, idPrefix?: string) =>
    allowOnly(app, url, corsOrigins.length > 0 ? [...allowed, 'OPTIONS'] : allowed, idPrefix === undefined ? undefined : (req) => isOwnId(req, idPrefix));
  addModelRoutes({ app, pool, metrics, shutdown, methods, healthReadyWithoutWorkers, scrape: cluster?.scrape ?? (() => metrics.registry.metrics()) });

  // The Responses API's state (retrieve, cancel, background, previous_response_id) lives beside the kept streams.
  const responses = streams === undefined ? undefined : new ResponseStore({ ttlMs: streams.opts.responseTtlMs, maxRecords: streams.opts.maxStreams, maxBytes: streams.opts.maxTotalBytes }, streams);
  streams?.watchResponses(responses!);
  // Stored chat completions: in the fleet's store where there is one (any frontend answers for them), else here.
  const ttlMs = streams?.opts.responseTtlMs ?? 0;
  const completions: CompletionStore | undefined =
    streams === undefined ? undefined : streams.shared !== undefined ? new RedisCompletionStore(streams.shared.store.client, ttlMs) : new MemoryCompletionStore({ ttlMs, maxRecords: streams.opts.maxStreams, maxBytes: streams.opts.maxTotalBytes });
  const out = createStreamOut({ relay, store: streams, log, adopted: (plan, kept, fmt) => responses?.adopt(plan, kept, fmt) ?? storedWhenTakenOver({ completions, log }, plan, kept) });
  if (streams?.shared !== undefined) {
    // A cancel asked at another frontend, for a stream this one runs; a stream whose frontend is gone, continued here.
    streams.shared.cancelled = (id) => responses!.cancelHere(id);
    streams.shared.takeover = (taken, opts) => out.continueTaken(taken, opts);
    streams.shared.listen();
  }
  const ids = responseIds(cluster?.slot);
  const ctx: RouteContext = {
    app,
    pool,
    relay,
    out,
    shutdown,
    log,
    streams,
    responses,
    completions,
    tokenize,
    methods,
    admit: (body, table) => {
      // A known model with no worker in discovery goes on to wait in the queue (its fields are then the worker's to check).
      const served = servedAs(pool, body.model, queueing);
      if (pool.hasModel(served.model)) checkFields((served.adapter === undefined ? body : { ...body, model: served.model }) as unknown as Record<string, unknown>, table, pool);
      return served;
    },
    // The queue's ticket (none without a queue: nothing per request then); the tier its answer says (default without a queue).
    ticket: (gens, tier, req, client, spend) => {
      const admitted = queueing ? tagTickets(gens, tier, req.headers, apiGuard, client, spend) : 'default';
      // The request's span names what it asks for; its bodies are sent to workers in it.
      if (tracing() !== undefined) traceBodies(req.raw, gens, admitted, () => tenantOf(req.headers, apiGuard));
      return admitted;
    },
    limit: async (req, reply, tokens) => {
      if (limiter === undefined) return undefined;
      const tenant = tenantOf(req.headers, apiGuard);
      const limits = limiter.limitsFor(tenant);
      if (limits === undefined) return undefined;
      const spend = await limiter.reserve(tenant, limits, tokens(limits));
      for (const name in spend.headers) reply.raw.setHeader(name, spend.headers[name]!);
      return spend;
    },
    holdLanes: (reply, model, count, n, spend) => {
      let taken: () => void;
      try {
        taken = lanes.take(count, pool.servingPath(model) === 'disaggregated' ? 2 : 1, { prompts: count / n, n });
      } catch (err) {
        spend?.end(503);
        throw err;
      }
      // The reservation settles once its answer's usage is known: with the room.
      const release = spend === undefined ? taken : () => (taken(), spend.end(reply.raw.statusCode));
      let until: Promise<void> | undefined;
      reply.raw.once('close', () => (until === undefined ? release() : void until.then(release)));
      return { keepUntil: (over: Promise<void>) => void (until = over) };
    },
    newId: ids.newId,
    toHolder: (id: string, req: FastifyRequest, reply: FastifyReply, body?: unknown) => {
      const holder = ids.holder(id);
      const url = holder === undefined ? undefined : cluster?.peerUrl?.(holder);
      if (url === undefined) return undefined;
      reply.hijack();
      return toPeer(url, req.method, req.url, req.headers, body, reply.raw);
    },
    tenantOf: (req) => (apiGuard === undefined ? '' : apiGuard(req.headers.authorization)),
    keeps: (req) => streams !== undefined && (keepStreams === 'all' || req.headers[RESUMABLE_HEADER] === '1'),
    toolParsing: (gen) => ({ syntax: pool.toolSyntax(gen.model) ?? HERMES_SYNTAX, key: toolKey(gen) }),
  };
  addCompletionRoutes(ctx);
  addStoredCompletionRoutes(ctx);
  addResponsesRoutes(ctx);
  if (streams !== undefined) addResumeRoutes(app, { store: streams, methods, toHolder: ctx.toHolder, tenantOf: ctx.tenantOf });
  methods('/v1/embeddings', ['POST']);
  addEmbeddingsRoute(app, {
    pool,
    upstream,
    shutdown,
    admit: ctx.admit,
    limit: (body, req, reply) => ctx.limit(req, reply, (limits) => (countsTokens(limits) ? embedTokens(body) : 0)),
    holdLane: (reply, model, spend) => void ctx.holdLanes(reply, model, 1, 1, spend),
    ticket: (body, req, spend) => {
      if (queueing) tagEmbedTicket(body, req.headers, apiGuard, spend);
      if (tracing() !== undefined) traceBodies(req.raw, [body], 'default', () => tenantOf(req.headers, apiGuard));
    },
  });
  return app;
}
