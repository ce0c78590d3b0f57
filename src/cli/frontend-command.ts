import { Command, InvalidArgumentError, Option } from 'commander';
import cluster from 'node:cluster';
import { availableParallelism } from 'node:os';
import { ADMIN_TOKEN_ENV, REQUEST_TOKEN_ENV, WORKER_ADMIN_TOKEN_ENV, assertAdminBindAllowed, createAdminGuard, loadAdminToken, loadAdminTokens, loadRequestToken } from '../common/admin-auth.js';
import { defaultLimits } from '../common/http-server.js';
import { createLogger } from '../common/logger.js';
import { startFrontend, type FrontendOptions } from '../frontend/frontend.js';
import { runChild } from '../frontend/cluster/child.js';
import { runPrimary } from '../frontend/cluster/primary.js';
import { DEFAULT_SHUTDOWN_GRACE_MS, DEFAULT_SHUTDOWN_TIMEOUT_MS, INTERACTIVE_SHUTDOWN_TIMEOUT_MS, shutdownTimeoutFor } from '../frontend/shutdown.js';
import { DEFAULT_MAX_LANES_PER_REQUEST } from '../frontend/api/lane-budget.js';
import { DEFAULT_PREFILL_TIMEOUT_MS } from '../frontend/relay/upstream.js';
import { DEFAULT_PREEMPTION_LIMIT } from '../frontend/relay/relay.js';
import { DEFAULT_OVERLAP_WEIGHT } from '../frontend/routing/router.js';
import { ROUTER_KINDS, type RouterKind } from '../frontend/routing/router-kinds.js';
import { OVERLAP_WEIGHT_HELP, ROUTER_HELP } from './router-flags.js';
import { DEFAULT_CLIENT_WRITE_TIMEOUT_MS } from '../frontend/relay/client-stream.js';
import { STREAM_STORE_DEFAULTS } from '../frontend/streams/stream-store.js';
import { DEFAULT_QUEUE_DEPTH, DEFAULT_QUEUE_TIMEOUT_MS } from '../frontend/admission/admission-queue.js';
import { isStoreUrl, parseStoreUrl, redactUrl, storePassword, STORE_PASSWORD_ENV } from '../frontend/streams/redis-store.js';
import { discoveryFlag, intOption, msOption, portOption, weightOption } from './options.js';
import { apiKeyFileOption, loadApiGuard } from './api-key-flag.js';
import { STORE_DOWN_MODES, type StoreDown } from '../frontend/limits/limiter.js';
import { CliError } from './cli-error.js';
import { exitTraced, startTracingOr } from './tracing-start.js';
import { hostname } from 'node:os';

interface FrontendFlags {
  host: string;
  port: number;
  discovery: string;
  adminHost: string;
  adminPort?: number;
  adminTokenFile?: string;
  workerAdminTokenFile?: string;
  shutdownTimeoutMs: number;
  shutdownGraceMs: number;
  upstreamHeadersTimeoutMs: number;
  streamIdleTimeoutMs: number;
  prefillTimeoutMs: number;
  migrationLimit: number;
  preemptionLimit: number;
  clientWriteTimeoutMs: number;
  maxLanesPerRequest: number;
  corsOrigin: string[];
  upstreamConnections?: number;
  healthReadyWithoutWorkers?: boolean;
  requestTokenFile?: string;
  apiKeyFile?: string;
  requestTimeoutMs: number;
  headersTimeoutMs: number;
  keepAliveTimeoutMs: number;
  maxConnections: number;
  adminMaxConnections: number;
  processes: number;
  router: RouterKind;
  kvOverlapWeight: number;
  streamStore: string;
  streamStorePasswordFile?: string;
  keepStreams: string;
  resumeGraceMs: number;
  resumeWindowMs: number;
  responseTtlMs: number;
  streamStoreMaxResponseBytes: number;
  streamStoreMaxBytes: number;
  streamStoreMaxStreams: number;
  queueTimeout: number;
  queueDepth: number;
  limitsFile?: string;
  limitsStoreDown: StoreDown;
}

/** --processes: a count, or `auto` for one per core. */
export function processesOption(v: string): number {
  if (v === 'auto') return availableParallelism();
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1 || n > 1024) throw new Error(`--processes takes a count from 1 or "auto", not "${v}"`);
  return n;
}

/** The admin port unless --admin-port says otherwise: next to the public port, or any port when that one is 0. */
export function defaultAdminPort(port: number): number {
  if (port === 0) return 0;
  if (port + 1 > 65535) throw new Error(`--port ${port} leaves no default admin port: pass --admin-port`);
  return port + 1;
}

const PUBLIC = defaultLimits('public');
const ADMIN = defaultLimits('admin');

export function frontendCommand(): Command {
  return new Command('frontend')
    .description('run the OpenAI-compatible frontend: routes requests to serving workers found through discovery')
    .option('--host <addr>', 'bind address', '127.0.0.1')
    .option('--port <n>', 'port (0 = any free port)', portOption, 8000)
    .addOption(discoveryFlag())
    .option('--admin-host <addr>', 'admin listener bind address (fleet view, drain/resume); non-loopback needs an admin token', '127.0.0.1')
    .option('--admin-port <n>', 'admin listener port (default: --port + 1, i.e. 8001; any free port when --port is 0; 0 = any)', portOption)
    .option('--admin-token-file <path>', `file holding the admin bearer token, for every admin route but the dashboard's page (env ${ADMIN_TOKEN_ENV})`)
    .option('--request-token-file <path>', `file holding the request-plane bearer token sent to workers (env ${REQUEST_TOKEN_ENV})`)
    .option('--worker-admin-token-file <path>', `file holding the admin token presented to workers' status reads and event streams (KV events, status), which need it where a worker has an admin token (env ${WORKER_ADMIN_TOKEN_ENV}; default: the first token of --admin-token-file, else the request-plane token)`)
    .addOption(apiKeyFileOption())
    .option('--request-timeout-ms <n>', 'a client request (headers and body) must arrive within this; 408 otherwise (both listeners)', msOption(1), PUBLIC.requestTimeoutMs)
    .option('--headers-timeout-ms <n>', 'request headers must arrive within this of the connection or previous response (both listeners)', msOption(1), PUBLIC.headersTimeoutMs)
    .option('--client-write-timeout-ms <n>', 'a streaming client that reads none of its answer for this long (its socket full) is disconnected, freeing its worker (0 = never)', msOption(0), DEFAULT_CLIENT_WRITE_TIMEOUT_MS)
    .option('--keep-alive-timeout-ms <n>', 'idle keep-alive connections are closed after this (both listeners)', msOption(1), PUBLIC.keepAliveTimeoutMs)
    .addOption(new Option('--max-connections <n>', 'open connections on the public port; past it a new one displaces an idle or slow one, or may only ask for /health').argParser(intOption(1)).default(PUBLIC.maxConnections, '(ulimit -n - 192) / 2, at least 16'))
    .option('--admin-max-connections <n>', 'open connections on the admin listener; past it a new one displaces an idle or slow one, or may only ask for a probe', intOption(1), ADMIN.maxConnections)
    .option('--upstream-headers-timeout-ms <n>', 'a worker that has not started answering after this long is treated as hung; the request moves on', msOption(1), 10_000)
    .option('--stream-idle-timeout-ms <n>', "a stream silent this long has its worker's /live probed; when that does not answer either, the stream moves to another worker (0 = never)", msOption(0), 10_000)
    .option('--prefill-timeout-ms <n>', 'a worker that has not answered /prefill (KV computed) or /embed (vectors computed) after this long is treated as hung; the request moves to another worker (0 = never)', msOption(0), DEFAULT_PREFILL_TIMEOUT_MS)
    .option('--health-ready-without-workers', '/health answers 200 even when no worker can take a request (default: 503 until one can)')
    .option('--upstream-connections <n>', 'connections per worker (default: as many as requests: the worker\'s admission is the limit); requests past it wait, counted by ebb_frontend_upstream_waiting_requests', intOption(1))
    .addOption(new Option('--cors-origin <origin>', 'let browsers on this origin call the API (repeatable; * for any)').argParser((v: string, all: string[]) => [...all, v]).default([] as string[], 'none'))
    .option('--max-lanes-per-request <n>', 'sequences (prompts x n) one request may open; 400 past it. Across requests, the fd limit bounds them: 503 frontend_overloaded (retryable) past it', intOption(1), DEFAULT_MAX_LANES_PER_REQUEST)
    .option('--migration-limit <n>', 'how many times one request may move to another worker when its worker fails or hands it off mid-stream (0 = never)', intOption(0), 3)
    .option('--preemption-limit <n>', 'how many times a flex stream may be paused (its client sees a pause; it continues exactly, first among flex, here or on another worker) for a priority request that finds every batch slot of its worker busy (0 = never)', intOption(0), DEFAULT_PREEMPTION_LIMIT)
    .addOption(new Option('--router <kind>', ROUTER_HELP).choices(ROUTER_KINDS).default('kv'))
    .option('--kv-overlap-weight <w>', OVERLAP_WEIGHT_HELP, weightOption, DEFAULT_OVERLAP_WEIGHT)
    .option('--shutdown-grace-ms <n>', 'on SIGTERM, /health answers 503 at once while the listeners keep accepting and serving for this long, so load balancers stop sending first (SIGINT: no grace)', msOption(0), DEFAULT_SHUTDOWN_GRACE_MS)
    .addOption(
      new Option('--processes <n>', 'relaying processes serving the one public port (node:cluster; `auto` = one per core); one admin listener and one /metrics for all of them')
        .argParser(processesOption)
        .default(1),
    )
    .option('--shutdown-timeout-ms <n>', `then, how long open streams and admin calls may finish before they are ended (server_closing; a kept stream is handed on to another frontend) and cut (exit 1 then); a Ctrl-C (SIGINT) waits at most ${INTERACTIVE_SHUTDOWN_TIMEOUT_MS / 1000} s`, msOption(0), DEFAULT_SHUTDOWN_TIMEOUT_MS)
    .option('--queue-timeout <ms>', 'a request no worker can take now (all draining, restarting or full) waits this long for one in the admission queue; 429 rate_limit_exceeded past it (0 = no queue: 503 no_serving_worker at once)', msOption(0), DEFAULT_QUEUE_TIMEOUT_MS)
    .option('--queue-depth <n>', 'requests waiting per model at most; past it 429 rate_limit_exceeded (a flex request gives its place to a higher tier first)', intOption(1), DEFAULT_QUEUE_DEPTH)
    .option(
      '--limits-file <path>',
      'per-tenant limits (the API key\'s name, else x-ebb-tenant): a JSON or YAML object { "<tenant>": { "requests_per_minute", "tokens_per_minute", "concurrent_streams", "tokens_per_day", "tokens_per_month" } } ("*": every tenant not named), reserved before a request runs and shared by every frontend of a Redis --stream-store (else counted in this frontend); re-read when it changes, no restart',
    )
    .addOption(
      new Option('--limits-store-down <mode>', "while the Redis --stream-store cannot be reached: open (count limits in this frontend alone, logged: each frontend admits up to each limit) or closed (503 limits_unavailable for tenants with limits)")
        .choices(STORE_DOWN_MODES)
        .default('closed'),
    )
    .option(
      '--stream-store <where>',
      'where streams are kept so a client can resume one (GET .../{id}?stream=true with Last-Event-ID): memory (this process), a Redis shared by a fleet of frontends (a resume at any of them; one taking over a stream whose frontend died): redis://[user:password@]host:port[/db], rediss://... (TLS), redis+sentinel://host:26379[,host:port...]/<master name> (Sentinel, failovers followed), redis+cluster://host:port[,host:port...] (Redis Cluster); or none',
      streamStoreOption,
      'memory',
    )
    .option('--stream-store-password-file <path>', `file holding the stream store's Redis password (its first line; env ${STORE_PASSWORD_ENV}), kept out of the URL, which is logged`)
    .addOption(
      new Option('--keep-streams <which>', 'which streams are kept for resumption: resumable (those whose client sends x-ebb-resumable: 1, as @ebb/client does; any other stream costs nothing extra and its client leaving cancels it at once), or all. Background responses always are')
        .choices(['resumable', 'all'])
        .default('resumable'),
    )
    .option('--resume-grace-ms <n>', "a stream whose client left goes on this long for a resume, then is cancelled (0 = at once, nothing kept running)", msOption(0), STREAM_STORE_DEFAULTS.graceMs)
    .option('--resume-window-ms <n>', 'an ended stream stays resumable this long', msOption(0), STREAM_STORE_DEFAULTS.windowMs)
    .option('--response-ttl-ms <n>', 'a stored Responses API response (store, the default) stays retrievable, and usable as previous_response_id, this long after it ended; a stored chat completion (store: true) this long after it was answered', msOption(0), STREAM_STORE_DEFAULTS.responseTtlMs)
    .option('--stream-store-max-response-bytes <n>', 'one stream kept at most this many bytes; a longer one is served, not resumable', intOption(1), STREAM_STORE_DEFAULTS.maxResponseBytes)
    .option('--stream-store-max-bytes <n>', 'all kept streams at most this many bytes; ended ones are forgotten first, oldest first', intOption(1), STREAM_STORE_DEFAULTS.maxTotalBytes)
    .option('--stream-store-max-streams <n>', 'streams kept at most (ended ones forgotten first)', intOption(1), STREAM_STORE_DEFAULTS.maxStreams)
    .action(async (flags: FrontendFlags) => {
      const token = await loadAdminTokens(flags.adminTokenFile);
      assertAdminBindAllowed(flags.adminHost, token, '--admin-host');
      const requestToken = await loadRequestToken(flags.requestTokenFile);
      // One token (a named file holds one: `frontend:secret`); a worker accepts it among its own.
      const workerAdminToken =
        flags.workerAdminTokenFile !== undefined ? await loadAdminToken(flags.workerAdminTokenFile, {}) : process.env[WORKER_ADMIN_TOKEN_ENV]?.trim() || token?.[0]?.token || requestToken;
      const apiGuard = await loadApiGuard(flags.apiKeyFile);
      // Each process would count alone (a tenant could spend N times its limits), and the primary's admin has no count to show.
      if (flags.limitsFile !== undefined && flags.processes > 1) throw new CliError('--limits-file runs with --processes 1 only (for now): run more frontends on the same Redis --stream-store instead');
      const adminPort = flags.adminPort ?? defaultAdminPort(flags.port);
      const timeouts = { requestTimeoutMs: flags.requestTimeoutMs, headersTimeoutMs: flags.headersTimeoutMs, keepAliveTimeoutMs: flags.keepAliveTimeoutMs };
      const log = createLogger('frontend');
      await startTracingOr(log, 'ebb-frontend', `${hostname()}:${process.pid}`);
      const opts: FrontendOptions = {
        host: flags.host,
        port: flags.port,
        discoveryUrl: flags.discovery,
        upstreamHeadersTimeoutMs: flags.upstreamHeadersTimeoutMs,
        streamIdleTimeoutMs: flags.streamIdleTimeoutMs,
        prefillTimeoutMs: flags.prefillTimeoutMs,
        migrationLimit: flags.migrationLimit,
        preemptionLimit: flags.preemptionLimit,
        clientWriteTimeoutMs: flags.clientWriteTimeoutMs,
        maxLanesPerRequest: flags.maxLanesPerRequest,
        corsOrigins: flags.corsOrigin,
        upstreamConnections: flags.upstreamConnections,
        healthReadyWithoutWorkers: flags.healthReadyWithoutWorkers,
        apiGuard,
        requestToken,
        workerAdminToken,
        router: flags.router,
        kvOverlapWeight: flags.kvOverlapWeight,
        queueTimeoutMs: flags.queueTimeout,
        queueDepth: flags.queueDepth,
        tenantLimits: flags.limitsFile === undefined ? undefined : { file: flags.limitsFile, storeDown: flags.limitsStoreDown },
        limits: { ...timeouts, maxConnections: flags.maxConnections },
        admin: { host: flags.adminHost, port: adminPort, guardAdmin: createAdminGuard(token), limits: { ...timeouts, maxConnections: flags.adminMaxConnections } },
        streamStore:
          flags.streamStore === 'none'
            ? undefined
            : {
                graceMs: flags.resumeGraceMs,
                windowMs: flags.resumeWindowMs,
                responseTtlMs: flags.responseTtlMs,
                maxResponseBytes: flags.streamStoreMaxResponseBytes,
                maxTotalBytes: flags.streamStoreMaxBytes,
                maxStreams: flags.streamStoreMaxStreams,
                writeTimeoutMs: flags.clientWriteTimeoutMs,
                redisUrl: isStoreUrl(flags.streamStore) ? flags.streamStore : undefined,
                redisPassword: storePassword(flags.streamStorePasswordFile),
              },
        keepStreams: flags.keepStreams as 'resumable' | 'all',
      };
      if (flags.processes > 1) {
        const stopOpts = { shutdownTimeoutMs: flags.shutdownTimeoutMs, shutdownGraceMs: flags.shutdownGraceMs };
        // Each child runs this same command line (node:cluster forks argv again) and lands here.
        return cluster.isPrimary ? runPrimary(opts, flags.processes, stopOpts, log) : runChild(opts, stopOpts, log);
      }
      const frontend = await startFrontend(opts, log);
      let stopping = false;
      let interrupted = false;
      // The grace is for a load balancer that routes to this frontend; Ctrl-C, or `ebb up` gone, has none to wait for.
      // A second signal, or `ebb up`'s second Ctrl-C: stop now, yet every open stream still ends
      // with an error event saying why, and every request not yet answered gets a 503.
      const force = (why: string) => {
        if (interrupted) return;
        interrupted = true;
        if (!stopping) {
          stopping = true;
          void frontend.close(flags.shutdownTimeoutMs, 0).catch(() => undefined);
        }
        void frontend.interrupt(`the frontend was stopped (${why}); retry`).finally(() => exitTraced(130));
      };
      const stop = (signal: NodeJS.Signals, graceMs = 0) => {
        if (stopping) return force(`${signal} again`);
        stopping = true;
        const timeoutMs = shutdownTimeoutFor(signal, flags.shutdownTimeoutMs);
        log.info({ event: 'frontend_stopping', signal, grace_ms: graceMs, timeout_ms: timeoutMs }, `stopping: finishing open streams (at most ${timeoutMs / 1000} s; ${signal} again to stop now)`);
        frontend.close(timeoutMs, graceMs).then(
          (clean) => (interrupted ? undefined : exitTraced(clean ? 0 : 1)),
          (err: unknown) => {
            log.error({ err }, 'stop failed');
            process.exit(1);
          },
        );
      };
      process.on('SIGTERM', () => stop('SIGTERM', flags.shutdownGraceMs));
      process.on('SIGINT', () => stop('SIGINT'));
      process.once('disconnect', () => stop('SIGTERM')); // started by `ebb up`, which went away
      if (process.send !== undefined) {
        process.on('message', (m: { type?: unknown } | null) => m?.type === 'interrupt' && force('ebb up: second Ctrl-C'));
        process.channel?.unref(); // listening must not keep the process alive
      }
      // Ready is said once a signal is handled: a SIGTERM right after it drains (it killed the process before).
      const adminAuth = token === undefined ? 'none' : 'bearer';
      log.info({ event: 'admin_ready', url: frontend.adminUrl, admin_auth: adminAuth }, `admin API ready: ${frontend.adminUrl}/workers`);
      log.info(
        { event: 'frontend_ready', url: frontend.url, admin_url: frontend.adminUrl, discovery: frontend.discovery.url },
        `frontend ready: ${frontend.url}/v1 (admin ${frontend.adminUrl})`,
      );
      // It may have gone before this listener existed ('disconnect' fires once): then stop now.
      if (process.send !== undefined && !process.connected) stop('SIGTERM');
    });
}

/** --stream-store: memory, none, or a Redis URL in one of the forms parseStoreUrl takes. */
function streamStoreOption(v: string): string {
  if (v === 'memory' || v === 'none') return v;
  try {
    if (isStoreUrl(v)) return parseStoreUrl(v) && v;
  } catch (err) {
    throw new InvalidArgumentError((err as Error).message);
  }
  throw new InvalidArgumentError(`expected memory, none, redis://host:port, rediss://, redis+sentinel://host:26379/<master> or redis+cluster://host:port, got "${redactUrl(v)}"`);
}
