import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Logger } from 'pino';
import type { AdminGuard } from '../common/admin-auth.js';
import { ADMIN_MAX_CONNECTIONS, defaultMaxConnections, fdLimit, listen, type HttpServerLimits } from '../common/http-server.js';
import { createAdminAgent } from '../common/worker-admin.js';
import { connectDiscovery } from '../discovery/connect.js';
import type { Discovery, DiscoveryEvent, FleetEvent, WorkerRecord } from '../discovery/discovery.js';
import { servingOnly } from '../discovery/serving-only.js';
import { createAdminServer } from './admin/admin-server.js';
import { FleetView } from './admin/fleet-view.js';
import { createFrontendMetrics } from './metrics.js';
import { createOpenAIServer } from './api/openai-server.js';
import { DEFAULT_MAX_LANES_PER_REQUEST, FD_RESERVE, fdBudget, LaneBudget } from './api/lane-budget.js';
import { Upstream } from './relay/upstream.js';
import { fdLimits, streamsRoom } from './fd-room.js';
import { Shutdown } from './shutdown.js';
import { StreamStore, type StreamStoreOptions } from './streams/stream-store.js';
import { createStreamMetrics } from './streams/stream-metrics.js';
import { SharedStreams } from './streams/shared-streams.js';
import { parseStoreUrl, RedisStore } from './streams/redis-store.js';
import { EbbError } from '../protocol/errors.js';
import { hostname } from 'node:os';
import { randomUUID } from 'node:crypto';
import { WorkerPool, type InflightListener } from './routing/worker-pool.js';
import type { Registry } from 'prom-client';
import type { AdminView, KvView } from './cluster/admin-view.js';
import { KvFeed } from './routing/kv-feed.js';
import type { KvEventSource } from './routing/kv-subscription.js';
import { createKvRouterMetrics } from './routing/kv-metrics.js';
import { Router } from './routing/router.js';
import type { RouterKind } from './routing/router-kinds.js';
import { COUNT_TIMEOUT_MS, workerTokenizer, workerTokens } from './routing/worker-tokenize.js';
import { AdmissionQueue, DEFAULT_QUEUE_DEPTH, DEFAULT_QUEUE_TIMEOUT_MS } from './admission/admission-queue.js';
import { createQueueMetrics } from './admission/queue-metrics.js';
import { queueFleet } from './admission/queue-fleet.js';
import { SaturationWatch } from './admission/saturation-watch.js';
import { newFrontendId, RouteMarking } from './routing/route-marking.js';
import { TenantLimiter, type StoreDown } from './limits/limiter.js';
import { LimitsFile } from './limits/limits-file.js';
import { RedisLimits } from './limits/redis-limits.js';
import { createLimitMetrics } from './limits/limit-metrics.js';

export interface FrontendOptions {
  host: string;
  port: number;
  discoveryUrl: string;
  /** How long a worker may take to start answering /generate before it counts as hung (default 10 s). */
  upstreamHeadersTimeoutMs?: number | undefined;
  /** How long a prefill worker may take to answer /prefill before it counts as hung (default 30 s; 0: no bound). */
  prefillTimeoutMs?: number | undefined;
  /** A committed stream silent this long gets its worker's /live probed; no answer moves the stream on (default 10 s). */
  streamIdleTimeoutMs?: number | undefined;
  /** How many times one request may move to another worker mid-stream (default 3). */
  migrationLimit?: number | undefined;
  /** How many times a flex stream may be paused for a priority request that found every slot busy (default 2; 0: never). */
  preemptionLimit?: number | undefined;
  /** A streaming client that reads nothing this long is disconnected (default 30 s; 0: never). */
  clientWriteTimeoutMs?: number | undefined;
  /** Origins browsers may call the API from (CORS); none by default. */
  corsOrigins?: string[] | undefined;
  /** Connections per worker (undefined: as many as requests; the worker's admission is the limit). */
  upstreamConnections?: number | undefined;
  /** /health is 200 even with no worker to route to (default: 503 until one can take a request). */
  healthReadyWithoutWorkers?: boolean | undefined;
  /** Client API keys for the public API (see createOpenAIServer). */
  apiGuard?: AdminGuard | undefined;
  /** Request-plane bearer token, sent on every call to a worker's /generate, /prefill and /kv. */
  requestToken?: string | undefined;
  /** Admin token presented to workers' event streams (/kv/events, /engine/status/events), which require it where a worker has one. */
  workerAdminToken?: string | undefined;
  /** Sequences (prompts x n) one request may open; 400 past it (default 128). */
  maxLanesPerRequest?: number | undefined;
  /** Connection bounds of the public listener (defaults: createHttpServer's for role 'public'). */
  limits?: HttpServerLimits | undefined;
  /** How each attempt's worker is chosen (default kv: prefix-cache overlap weighed against load). */
  router?: RouterKind | undefined;
  /** kv router: weight of the uncached prompt tokens against the load (default 1). */
  kvOverlapWeight?: number | undefined;
  /** The admin listener (fleet view, drain/resume forwarding); the caller checks the bind is allowed. */
  admin?: { host: string; port: number; guardAdmin?: AdminGuard | undefined; limits?: HttpServerLimits | undefined } | undefined;
  /** Set in each process of `ebb frontend --processes N` (see cluster/child.ts). */
  cluster?: ClusterHooks | undefined;
  /** Streams kept for resumption (--stream-store memory, the default); undefined: none kept. */
  streamStore?: StreamStoreOptions | undefined;
  /** Which streams are kept: those whose client asks (x-ebb-resumable: 1), or all; background responses always. */
  keepStreams?: 'resumable' | 'all' | undefined;
  /** A worker's own --openai-port (worker/openai-port.ts): its registration as the only discovery (discoveryUrl names it), its record never forgotten. */
  own?: { discovery: Discovery; record: WorkerRecord } | undefined;
  /** How long a request no worker can take now may wait for one (default 30 s; 0: no queue, 503 at once). */
  queueTimeoutMs?: number | undefined;
  /** Requests waiting per model at most (default DEFAULT_QUEUE_DEPTH); past it 429 rate_limit_exceeded. */
  queueDepth?: number | undefined;
  /** Tenants' limits (--limits-file), counted in the stream store's Redis where there is one; `storeDown`: while it cannot be read. */
  tenantLimits?: { file: string; storeDown: StoreDown } | undefined;
}

export interface ClusterHooks {
  /** Which process (0..N-1): sent as the x-ebb-frontend-process response header. */
  slot: number;
  /** Told each change of this process's in-flight counts, to share with its peers. */
  onInflight: InflightListener;
  /** The public /metrics: every process's metrics, aggregated (this process's alone would count a share). */
  scrape: () => Promise<string>;
  /** Workers' KV events through the primary's one subscription per worker (cluster/kv-follow.ts). */
  kvSource: (record: WorkerRecord) => KvEventSource;
  /** The loopback URL of process `slot`'s peer listener (a resume for a stream it holds goes there). */
  peerUrl?: ((slot: number) => string | undefined) | undefined;
  /** The frontend's name on the request plane, the primary's: workers count its processes as one frontend (their in-flight is shared already). */
  routedBy?: string | undefined;
}

export interface RunningFrontend {
  url: string;
  /** With --processes N: this process's own loopback listener, where its peers pass requests for what it holds. */
  peerUrl?: string | undefined;
  /** The admin listener's base URL, when one was asked for. */
  adminUrl?: string | undefined;
  pool: WorkerPool;
  router: Router;
  discovery: Discovery;
  /** This process's metrics. */
  registry: Registry;
  /** What the admin API shows of this process's routing and traffic (a `--processes` child sends it to the primary). */
  adminView(): AdminView;
  /**
   * Fails readiness at once and keeps serving for `graceMs` (a load balancer notices before
   * anything is refused); then stops accepting on both listeners, lets open streams and admin calls
   * finish for up to `timeoutMs`, then ends what is left: requests with a server_closing answer (an
   * SSE error event in a stream), then any connection still open. Resolves true when nothing had to be cut.
   */
  close(timeoutMs: number, graceMs?: number): Promise<boolean>;
  /**
   * The forced stop (a second Ctrl-C): ends every open request now as the deadline would (an SSE
   * error event in a stream, a 503 before one), then cuts the connections. Resolves once they
   * answered (bounded); the caller then exits.
   */
  interrupt(message: string): Promise<void>;
}

/** The stream store: this process's memory, shared through Redis by a fleet of frontends when one is named. */
function keptStreams(o: StreamStoreOptions, clientWriteTimeoutMs: number | undefined, registry: Registry, log: Logger): StreamStore {
  const writeTimeoutMs = clientWriteTimeoutMs ?? o.writeTimeoutMs;
  const metrics = createStreamMetrics(registry, log);
  // Unique per process start: a restarted frontend (the same host and pid in a container) is another owner.
  const owner = `${hostname()}:${process.pid}:${randomUUID().slice(0, 8)}`;
  const shared =
    o.redisUrl === undefined
      ? undefined
      : new SharedStreams(new RedisStore(parseStoreUrl(o.redisUrl, o.redisPassword), log, metrics.storeUp, owner), {
          owner,
          windowMs: o.windowMs,
          maxResponseBytes: o.maxResponseBytes,
          writeTimeoutMs,
          log,
          onTakeover: () => metrics.takenOver(),
        });
  return new StreamStore({ ...o, writeTimeoutMs }, metrics, shared);
}

/** Tenants' limits from their file, counted in the fleet's Redis (the stream store's) where there is one, else in this process. */
async function tenantLimiter(o: FrontendOptions['tenantLimits'], redis: RedisStore | undefined, registry: Registry, log: Logger): Promise<TenantLimiter | undefined> {
  if (o === undefined) return undefined;
  const limitsLog = log.child({ component: 'limits' });
  const file = await LimitsFile.open(o.file, limitsLog);
  const shared = redis === undefined ? undefined : { store: new RedisLimits(redis.client), healthy: () => redis.healthy };
  const limiter = new TenantLimiter({ limits: file, shared, storeDown: o.storeDown, log: limitsLog, metrics: createLimitMetrics(registry) });
  limitsLog.info(
    { event: 'limits', path: o.file, tenants: file.table.tenants.size, any_tenant: file.table.any !== undefined, store: shared === undefined ? 'memory' : 'redis', store_down: o.storeDown },
    `tenant limits from ${o.file}: ${file.table.tenants.size} tenant(s)${file.table.any !== undefined ? ' and *' : ''}, counted ${shared === undefined ? 'in this frontend' : "in the stream store's Redis, for every frontend that shares it"}`,
  );
  return limiter;
}

/** A loopback listener on any free port; resolves with its URL. */
function listenPeer(server: Server): Promise<string> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve(`http://127.0.0.1:${(server.address() as AddressInfo).port}`));
  });
}

/** The per-request and fd bounds on sequences, logged: the numbers an operator sizes `ulimit -n` by. */
function laneBudget(opts: FrontendOptions, log: Logger): LaneBudget {
  const limit = fdLimit();
  const hard = fdLimits()?.hard;
  const adminMax = opts.admin ? (opts.admin.limits?.maxConnections ?? ADMIN_MAX_CONNECTIONS) : 0;
  const fds = fdBudget(limit, adminMax);
  const perRequest = opts.maxLanesPerRequest ?? DEFAULT_MAX_LANES_PER_REQUEST;
  const streams = fds === undefined ? undefined : streamsRoom(fds);
  log.info(
    {
      event: 'frontend_limits',
      fd_limit: limit ?? null,
      fd_limit_hard: hard ?? null,
      fd_budget: fds ?? null,
      fd_reserve: FD_RESERVE,
      streams_room: streams ?? null,
      admin_max_connections: adminMax,
      max_connections: opts.limits?.maxConnections ?? defaultMaxConnections('public'),
      max_lanes_per_request: perRequest,
    },
    fds === undefined
      ? `fd limit unknown: no fd budget; at most ${perRequest} sequences per request`
      : `fd limit ${limit} (hard ${hard ?? 'unknown'}): ${fds} descriptors for client connections and worker sockets (${FD_RESERVE} reserved, ${adminMax} for the admin listener), room for about ${streams} concurrent streams in this process; at most ${perRequest} sequences per request`,
  );
  // Node raises the soft limit to the hard one at start; below it, something stopped that (a wrapper, a sandbox).
  if (limit !== undefined && typeof hard === 'number' && limit < hard)
    log.warn({ event: 'fd_limit_below_hard', fd_limit: limit, fd_limit_hard: hard }, `the fd limit ${limit} is below the hard limit ${hard}: run under \`ulimit -n ${hard}\` for room for about ${streamsRoom(fdBudget(hard, adminMax) ?? 0)} streams`);
  return new LaneBudget(perRequest, fds);
}

export async function startFrontend(opts: FrontendOptions, log: Logger): Promise<RunningFrontend> {
  const discovery = opts.own?.discovery ?? (await connectDiscovery(opts.discoveryUrl));
  const pool = new WorkerPool(opts.cluster?.onInflight, opts.own?.record);
  const fleet = new FleetView();
  const routerKind = opts.router ?? 'kv';
  // What this frontend is called in the workers' load events (each /generate names it).
  const routedBy = opts.cluster?.routedBy ?? newFrontendId();
  // The KV index follows discovery from the first event, so the first requests already find it.
  const kvFeed = routerKind === 'kv' ? new KvFeed(log, { workerAdminToken: opts.workerAdminToken, source: opts.cluster?.kvSource, self: routedBy }) : undefined;
  // Workers are ready for a rollout once every frontend marks them (a worker's own --openai-port marks nothing: no rollout waits on it).
  const marking = opts.own === undefined ? new RouteMarking(discovery.routeMarks, newFrontendId(), () => pool.all().map((w) => w.record.worker_id), log) : undefined;
  // The fleet view and the KV feed follow serving workers; the pool also those loading (their requests wait for them).
  const serving = servingOnly((event: DiscoveryEvent) => {
    fleet.apply(event);
    kvFeed?.apply(event);
    marking?.changed();
    if (event.type === 'reset') log.info({ event: 'discovery_reset', workers: event.records.map((r) => r.worker_id) }, `routing view: ${event.records.length} worker(s)`);
    else if (event.type === 'put') log.info({ event: 'worker_added', worker_id: event.record.worker_id, model: event.record.model, ...(event.record.adapters ? { adapters: event.record.adapters.resident } : {}) }, `worker ${event.record.worker_id} joined`);
    else log.info({ event: 'worker_removed', worker_id: event.worker_id }, `worker ${event.worker_id} left`);
  });
  const watch = await discovery.watchAll((event: FleetEvent) => {
    const abandoned = event.type === 'delete' ? pool.loadingRecord(event.worker_id) : undefined;
    pool.apply(event);
    serving(event);
    if (event.type === 'loading') log.info({ event: 'worker_loading', worker_id: event.record.worker_id, model: event.record.model, mode: event.record.mode }, `worker ${event.record.worker_id} is loading "${event.record.model}": its requests wait for it`);
    else if (event.type === 'reset' && event.loading !== undefined && event.loading.length > 0) log.info({ event: 'workers_loading', workers: event.loading.map((r) => r.worker_id) }, `${event.loading.length} worker(s) loading`);
    else if (abandoned !== undefined) log.info({ event: 'worker_loading_abandoned', worker_id: abandoned.worker_id, model: abandoned.model }, `worker ${abandoned.worker_id} left while loading: requests for "${abandoned.model}" no longer wait for it`);
  });
  const metrics = createFrontendMetrics(pool);
  const upstreamAgentHeaders: Record<string, string> = opts.requestToken === undefined ? {} : { authorization: `Bearer ${opts.requestToken}` };
  const routerLog = log.child({ component: 'router' });
  const router = new Router(pool, { kind: routerKind, overlapWeight: opts.kvOverlapWeight, feed: kvFeed, metrics: createKvRouterMetrics(metrics.registry, kvFeed), log: routerLog });
  log.info({ event: 'router', router: routerKind, kv_overlap_weight: opts.kvOverlapWeight ?? 1 }, `routing: ${routerKind}`);
  const queueTimeoutMs = opts.queueTimeoutMs ?? DEFAULT_QUEUE_TIMEOUT_MS;
  // The queue's reads of departed workers' status; none without a queue (every --openai-port, --queue-timeout 0).
  const fleetAgent = queueTimeoutMs === 0 ? undefined : createAdminAgent();
  const admissionLog = log.child({ component: 'admission' });
  const admission = fleetAgent === undefined ? undefined : new AdmissionQueue({ timeoutMs: queueTimeoutMs, depth: opts.queueDepth ?? DEFAULT_QUEUE_DEPTH, log: admissionLog }, queueFleet(pool, fleet, fleetAgent, { timeoutMs: queueTimeoutMs, log: admissionLog, workerAdminToken: opts.workerAdminToken ?? opts.requestToken }, discovery.drainIntents), createQueueMetrics(metrics.registry));
  if (admission !== undefined) {
    pool.onRoom = (model) => admission.changed(model);
    metrics.stats.queued = (model) => admission.waiting(model);
    metrics.stats.queuedByTier = (model) => admission.waitingByTier(model);
  }
  // With a queue, a full worker's own status says when it has room again (queued requests wait on it).
  const saturation = admission === undefined ? undefined : new SaturationWatch(pool, opts.workerAdminToken ?? opts.requestToken, admissionLog);
  if (saturation !== undefined) fleet.on('left', (id: string) => saturation.forget(id));
  const upstream = new Upstream(pool, metrics, { admission, router, headersTimeoutMs: opts.upstreamHeadersTimeoutMs, requestToken: opts.requestToken, streamIdleTimeoutMs: opts.streamIdleTimeoutMs, prefillTimeoutMs: opts.prefillTimeoutMs, connections: opts.upstreamConnections, routedBy: kvFeed === undefined ? undefined : routedBy });
  // Tokenizing through a worker shares the request plane's connections and its token.
  router.setTokenizer(workerTokenizer(upstream.agent, upstreamAgentHeaders));
  // POST /v1/responses/input_tokens counts through a worker too, waiting longer than the routing path does.
  const tokenize = workerTokens(upstream.agent, upstreamAgentHeaders, COUNT_TIMEOUT_MS);
  const lanes = laneBudget(opts, log);
  const shutdown = new Shutdown();
  const streams = opts.streamStore === undefined ? undefined : keptStreams(opts.streamStore, opts.clientWriteTimeoutMs, metrics.registry, log);
  await streams?.shared?.store.connect(5_000);
  const limiter = await tenantLimiter(opts.tenantLimits, streams?.shared?.store, metrics.registry, log);
  const app = createOpenAIServer({ pool, upstream, metrics, log, limits: opts.limits, migrationLimit: opts.migrationLimit, preemptionLimit: opts.preemptionLimit, clientWriteTimeoutMs: opts.clientWriteTimeoutMs, corsOrigins: opts.corsOrigins, healthReadyWithoutWorkers: opts.healthReadyWithoutWorkers, lanes, shutdown, apiGuard: opts.apiGuard, cluster: opts.cluster, streams, keepStreams: opts.keepStreams, queueing: admission !== undefined, limiter, tokenize });
  const url = await listen(app, opts.host, opts.port);
  // A process of several: its peers reach it here (the shared port gives a connection to any of them).
  const peerServer = opts.cluster === undefined ? undefined : createServer((req, res) => app.server.emit('request', req, res));
  const peerUrl = peerServer === undefined ? undefined : await listenPeer(peerServer);
  // server.close() only drops connections idle at that moment; a keep-alive connection whose stream
  // ends during shutdown must be dropped when it goes idle, or close() waits for its idle timeout.
  let closing = false;
  const dropWhenIdle = (server: typeof app.server) =>
    server.on('request', (_req, res) => {
      res.once('finish', () => {
        if (closing) setImmediate(() => server.closeIdleConnections());
      });
    });
  dropWhenIdle(app.server);
  const adminAgent = opts.admin ? createAdminAgent() : undefined;
  const kvView = (id: string): KvView => {
    // What other frontends have on it, as its load events say (kv router, two or more frontends following it).
    const others = kvFeed?.load.of(id);
    const elsewhere = others === undefined ? {} : { other_frontends: { inflight: others.inflight, queued_prefill_tokens: others.prefillSum } };
    return { router: routerKind, queued_prefill_tokens: router.queuedPrefill(id), ...elsewhere, ...(kvFeed?.describe(id) ?? {}) };
  };
  const adminApp = opts.admin && adminAgent ? createAdminServer({ fleet, pool, intents: discovery.drainIntents, scaleDownLocks: discovery.scaleDownLocks, stats: metrics.stats, kv: kvView, agent: adminAgent, guardAdmin: opts.admin.guardAdmin, workerAdminToken: opts.workerAdminToken, limits: opts.admin.limits, metricsRegistry: metrics.registry, tenants: limiter === undefined ? undefined : () => limiter.report() }) : undefined;
  let adminUrl: string | undefined;
  if (adminApp && opts.admin) {
    try {
      adminUrl = await listen(adminApp, opts.admin.host, opts.admin.port);
      dropWhenIdle(adminApp.server);
    } catch (err) {
      await app.close();
      await watch.close();
      await kvFeed?.close();
      await upstream.close();
      await fleetAgent?.close().catch(() => undefined);
      await saturation?.close();
      marking?.close();
      await discovery.close();
      throw new Error(`admin listener on ${opts.admin.host}:${opts.admin.port}: ${(err as Error).message}`);
    }
  }
  // Ends every open request with server_closing, then closes the connections: once, at the shutdown
  // deadline or at a forced stop, whichever comes first.
  let cutting: Promise<void> | undefined;
  const cutAll = (message: string): Promise<void> =>
    (cutting ??= shutdown.cutOpen(message).then(() => {
      app.server.closeAllConnections();
      adminApp?.server.closeAllConnections();
      adminAgent?.destroy().catch(() => undefined); // a forward still waiting on a worker ends too
    }));

  return {
    url,
    peerUrl,
    adminUrl,
    pool,
    router,
    discovery,
    registry: metrics.registry,
    adminView: () => ({ kv: Object.fromEntries(pool.all().map((w) => [w.record.worker_id, kvView(w.record.worker_id)])), models: metrics.stats.summary() }),
    async close(timeoutMs, graceMs = 0) {
      shutdown.notReady = true;
      // What this frontend lets go of is for the others to continue: it takes nothing over from now on.
      streams?.shared?.retire();
      if (graceMs > 0) {
        log.info({ event: 'shutdown_grace', grace_ms: graceMs }, `/health answers 503; still accepting for ${graceMs} ms`);
        await new Promise((resolve) => setTimeout(resolve, graceMs));
      }
      // Stop accepting now, not a few ticks into fastify's close (which still waits for the connections).
      app.server.close();
      adminApp?.server.close();
      log.info({ event: 'shutdown_accepting_stopped', timeout_ms: timeoutMs }, `no longer accepting; open requests may finish for ${timeoutMs} ms`);
      // The routing view stays live until the last stream is done: retries still need it.
      closing = true;
      // One deadline for both listeners: a stalled admin call (half a request, a client that never
      // reads) is cut with the streams, never waited on past it. Requests get their answer first.
      const deadline = setTimeout(() => {
        // Kept streams the fleet's store shares are handed on (their clients resume at another frontend); the rest end with server_closing.
        const handedOn = streams?.shared?.healthy === true ? streams.liveShared().length : 0;
        const open = shutdown.openRequests;
        log.warn(
          { event: 'shutdown_deadline', open_requests: open, handed_on: handedOn, open_connections: 'cut' },
          handedOn === 0
            ? `${open} request(s) still open after ${timeoutMs} ms: ending them with server_closing (an error their clients raise), then closing the connections`
            : `${open} request(s) still open after ${timeoutMs} ms: ${handedOn} kept stream(s) handed on (their clients get stream_interrupted with where to resume, at any frontend), the rest ended with server_closing; then closing the connections`,
        );
        void cutAll(`the frontend is shutting down: the request was still open at its shutdown deadline (${timeoutMs} ms); retry`);
      }, timeoutMs);
      peerServer?.close();
      await Promise.all([adminApp?.close().then(() => adminAgent?.close().catch(() => undefined)), app.close()]);
      clearTimeout(deadline);
      peerServer?.closeAllConnections();
      // Generations with no connection to wait on (background responses, clients gone within their resume
      // grace): handed on where the fleet's store shares them, else ended with the frontend.
      await streams?.cancelAll(new EbbError('server_closing', 'the frontend is closing'));
      await streams?.close();
      await watch.close();
      await kvFeed?.close();
      await upstream.close();
      await fleetAgent?.close().catch(() => undefined);
      await saturation?.close();
      marking?.close();
      limiter?.close();
      await discovery.close();
      return cutting === undefined;
    },
    async interrupt(message) {
      shutdown.notReady = true;
      streams?.shared?.retire();
      app.server.close();
      adminApp?.server.close();
      log.warn({ event: 'shutdown_interrupted', open_requests: shutdown.openRequests }, `${shutdown.openRequests} request(s) still open: ending them with server_closing now (${message})`);
      await cutAll(message);
    },
  };
}
