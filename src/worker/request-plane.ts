import type { FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import type { AdminGuard } from '../common/admin-auth.js';
import { allowOnly, createHttpServer } from '../common/http-server.js';
import type { WorkerMode } from '../protocol/worker-mode.js';
import type { Engine } from '../engine/engine.js';
import type { Admission } from '../lifecycle/admission.js';
import { GenerateBodySchema, type GenerateBody } from '../protocol/request-plane.js';
import type { KvPullOutcome } from './kv-state-wire.js';
import type { WorkerMetrics } from './metrics.js';
import type { PrefillPeers } from './prefill-peers.js';
import type { PriorityReserve } from './priority-reserve.js';
import { Generations } from './generation.js';
import { addKvRoutes } from './kv-routes.js';
import { OpenRequests } from './open-requests.js';
import { Preemption, type PreemptionDeps } from './preemption.js';
import { RequestGate } from './request-gate.js';
import { addTokenizeRoute } from './tokenize-route.js';
import { addEmbedRoute } from './embed-route.js';
import { DEFAULT_MAX_EMBEDDING_TOKENS } from './embedding-tokens.js';
import type { WorkerAdapters } from './adapters.js';
import { PREFILL_TOKENS_HEADER, ROUTED_BY_HEADER } from '../protocol/kv-events.js';
import type { RoutedLoad } from './routed-load.js';
import { traceWorkerRequest } from '../tracing/worker-trace.js';

export { MAX_TOKENIZING } from './tokenize-route.js';

export interface RequestPlaneDeps {
  model: string;
  workerId: string;
  mode: WorkerMode;
  engine: Engine;
  admission: Admission;
  metrics: WorkerMetrics;
  log: Logger;
  /** This request plane's own URL, the source decode peers pull KV from. */
  selfUrl: () => string;
  /** Decode workers: the prefill workers whose KV they may pull. */
  prefillPeers?: PrefillPeers | undefined;
  /** Checks the request-plane token on every route, when one is configured. */
  guard?: AdminGuard | undefined;
  /** Sent to prefill peers when pulling KV. */
  requestToken?: string | undefined;
  /** Counts each pull of a real KV state by how it ended. */
  onKvPull?: ((outcome: KvPullOutcome) => void) | undefined;
  adapters?: WorkerAdapters | undefined;
  /** The drain's ETA (the lifecycle's status eta_ms): a draining refusal's Retry-After. */
  drainEtaMs?: (() => number | null) | undefined;
  /** The batch slots flex requests leave free (--priority-reserve-slots). */
  priorityReserve?: PriorityReserve | undefined;
  /** The most tokens one /embed may carry, all its inputs together (--max-embedding-tokens). */
  maxEmbeddingTokens?: number | undefined;
  /** Where preemptions are recorded (the lifecycle's audit trail and generation). */
  audit?: PreemptionDeps['audit'];
  /** What each routing frontend has in flight here (each /generate names its frontend). */
  routedLoad?: RoutedLoad | undefined;
}

export interface RequestPlane {
  app: FastifyInstance;
  /** Admitted requests whose scope is open. */
  readonly open: number;
  /** Shutdown deadline: ends every open request with a terminal `worker_shut_down` line; resolves once all are closed. */
  cutAll(signal: AbortSignal): Promise<void>;
  /**
   * Drain deadline: ends every open generation with a terminal hand-off line, for the caller to
   * continue elsewhere. Returns how many were handed off; `closed` settles once they are released.
   */
  handOffAll(): { count: number; closed: Promise<void> };
  /** Estimated ms until every admitted request is done (see drain-eta); null when unknown. */
  drainEta(): number | null;
}

/**
 * The worker's request plane: POST /generate (and /embed, /prefill, /kv/:id, /tokenize), admission-checked
 * before any work is done. The path of a /generate: the gate (request-gate.ts) admits it and opens
 * its scope, the generation (generation.ts) pulls its KV and streams its tokens until its scope
 * ends, and the open requests (open-requests.ts) are what a drain deadline hands off or a shutdown cuts.
 */
export function createRequestPlane(deps: RequestPlaneDeps): RequestPlane {
  const { model, workerId, mode, engine, admission, metrics, log, selfUrl, prefillPeers, guard, requestToken, onKvPull, adapters } = deps;
  const app = createHttpServer({ role: 'internal' });
  const open = new OpenRequests();
  const gate = new RequestGate({ model, mode, engine, admission, metrics, log, prefillPeers, adapters, drainEtaMs: deps.drainEtaMs, priorityReserve: deps.priorityReserve }, open);
  const generations = new Generations({ workerId, engine, metrics, log, selfUrl, requestToken, onKvPull, pace: open.pace });
  const preemption = new Preemption({ engine, open, metrics, log, audit: deps.audit });

  if (guard) app.addHook('onRequest', async (req) => guard(req.headers.authorization));

  allowOnly(app, '/generate', ['POST']);
  app.post<{ Body: GenerateBody }>('/generate', { schema: { body: GenerateBodySchema } }, async (req, reply) => {
    // Tracing on: the worker's span of the request, under the frontend's attempt (its traceparent).
    const admitted = gate.admit(req.body, reply.raw, traceWorkerRequest(req.raw, reply.raw, '/generate', workerId, model));
    if ('refused' in admitted) return gate.refuse(reply, admitted.refused);
    reply.hijack();
    admitted.scope.routed = deps.routedLoad?.admit(req.headers[ROUTED_BY_HEADER], req.headers[PREFILL_TOKENS_HEADER]);
    open.generating(admitted.scope);
    preemption.admitted(admitted.scope);
    await generations.serve(admitted.scope, admitted.gen, req.body.stream !== false, req.body.kv_transfer, gate.trustedHandoff(req.body.handoff_kv));
  });
  addTokenizeRoute(app, model, engine, admission);
  addEmbedRoute(app, { workerId, model, engine, gate, generations, metrics, maxTokens: deps.maxEmbeddingTokens ?? DEFAULT_MAX_EMBEDDING_TOKENS });
  addKvRoutes(app, { workerId, model, mode, engine, selfUrl, gate, generations });

  return {
    app,
    get open() {
      return open.size;
    },
    cutAll: (signal) => open.cutAll(signal),
    handOffAll: () => open.handOffAll(),
    drainEta: () => open.drainEta(engine.stats().batch_slots),
  };
}
