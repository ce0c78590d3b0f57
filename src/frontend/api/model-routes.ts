import type { FastifyInstance } from 'fastify';
import { CAPABILITIES } from '../../protocol/capabilities.js';
import type { FrontendMetrics } from '../metrics.js';
import { modelNotFound } from '../relay/worker-answer.js';
import type { WorkerPool } from '../routing/worker-pool.js';
import type { Shutdown } from '../shutdown.js';

/** The capabilities a client can ask for (continuation is ebb's own business). */
const API_CAPABILITIES = CAPABILITIES.filter((c) => c !== 'continuation');

export interface ModelRoutesDeps {
  app: FastifyInstance;
  pool: WorkerPool;
  metrics: FrontendMetrics;
  shutdown: Shutdown;
  methods(url: string, allowed: Array<'GET' | 'POST'>): void;
  /** /health answers 200 even when no worker can take a request. */
  healthReadyWithoutWorkers: boolean;
  /** The public /metrics (with --processes N: every process's, aggregated). */
  scrape: () => Promise<string>;
}

/** What is served besides generation: /v1/models (and each model), and the probes /live, /health, /metrics. */
export function addModelRoutes({ app, pool, metrics, shutdown, methods, healthReadyWithoutWorkers, scrape }: ModelRoutesDeps): void {
  // Every model a request may name without a 404: `unavailable` while none of its workers is in
  // discovery (all drained or restarting), when a request for it gets a retryable 503.
  // `capabilities`: what some worker of the model declares now (a request that needs one nobody declares is a 400 naming its field).
  const model = (id: string) => ({
    id,
    object: 'model',
    created: 0,
    owned_by: 'ebb',
    status: pool.hasModel(id) ? 'available' : 'unavailable',
    engines: pool.engineKinds(id),
    capabilities: API_CAPABILITIES.filter((c) => pool.declares(id, c)),
  });
  // LoRA adapters as vLLM lists them: each its own model, `parent` its base model.
  const adapterModel = (a: { name: string; base: string; available: boolean }) => ({ ...model(a.base), id: a.name, root: a.name, parent: a.base, status: a.available ? 'available' : 'unavailable' });

  methods('/v1/models', ['GET']);
  app.get('/v1/models', async () => ({ object: 'list', data: [...pool.knownModels().map(model), ...pool.knownAdapters().map(adapterModel)] }));

  methods('/v1/models/:id', ['GET']);
  app.get<{ Params: { id: string } }>('/v1/models/:id', async (req) => {
    if (pool.knows(req.params.id)) return model(req.params.id);
    const adapter = pool.knownAdapters().find((a) => a.name === req.params.id);
    if (adapter === undefined) throw modelNotFound(req.params.id);
    return adapterModel(adapter);
  });

  // Liveness: the process answers. /health is 503 while no worker serves, which must not restart a frontend.
  methods('/live', ['GET']);
  app.get('/live', async () => ({ status: 'ok' }));

  methods('/health', ['GET']);
  app.get('/health', async (_req, reply) => {
    // Per model: workers in discovery, and those this frontend would route to now (not held out).
    const models: Record<string, { workers: number; serving: number }> = {};
    const now = Date.now();
    for (const w of pool.all()) {
      const m = (models[w.record.model] ??= { workers: 0, serving: 0 });
      m.workers++;
      if (!(w.hold && w.hold.until > now)) m.serving++;
    }
    const canRoute = Object.values(models).some((m) => m.serving > 0);
    // Shutting down: not ready at once, so a load balancer stops sending before the listener stops accepting.
    const ready = (canRoute || healthReadyWithoutWorkers) && !shutdown.notReady;
    const status = shutdown.notReady ? 'shutting_down' : ready ? 'ok' : 'not_ready';
    return reply.code(ready ? 200 : 503).send({ status, can_route: canRoute, workers: pool.size, models });
  });

  methods('/metrics', ['GET']);
  app.get('/metrics', async (_req, reply) => reply.header('content-type', metrics.registry.contentType).send(await scrape()));
}
