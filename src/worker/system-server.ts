import type { FastifyInstance } from 'fastify';
import type { Engine } from '../engine/engine.js';
import { allowOnly, createHttpServer } from '../common/http-server.js';
import type { Lifecycle, LifecycleStatus } from '../lifecycle/lifecycle.js';
import type { WorkerMetrics } from './metrics.js';
import { DrainBodySchema, EmptyBodySchema, type DrainBody } from '../protocol/admin.js';

export interface SystemServerDeps {
  lifecycle: Lifecycle;
  engine: Engine;
  metrics: WorkerMetrics;
  /** Guards mutating admin routes (drain, resume); see admin-auth. */
  guardAdmin?: (authorization: string | undefined) => void;
}


/**
 * The system-status server: probes, metrics and the Admin API, on their own port so the request
 * plane never carries them. /live stays 200 while draining: drain must not get the pod killed.
 */
export function createSystemServer({ lifecycle, engine, metrics, guardAdmin }: SystemServerDeps): FastifyInstance {
  const app = createHttpServer({ role: 'admin', bodyLimit: 64 * 1024, emptyJsonIsObject: true });

  const statusBody = (s: LifecycleStatus) => ({ ...s, engine: engine.stats() });

  allowOnly(app, '/live', ['GET']);
  app.get('/live', async () => ({ status: 'alive', state: lifecycle.state }));

  allowOnly(app, '/health', ['GET']);
  app.get('/health', async (_req, reply) => {
    const state = lifecycle.state;
    const ready = state === 'serving';
    return reply.code(ready ? 200 : 503).send({ status: ready ? 'ready' : 'not_ready', state, discovery: lifecycle.discoveryPresence });
  });

  allowOnly(app, '/metrics', ['GET']);
  app.get('/metrics', async (_req, reply) => {
    return reply.header('content-type', metrics.registry.contentType).send(await metrics.registry.metrics());
  });

  allowOnly(app, '/engine/status', ['GET']);
  app.get('/engine/status', async () => statusBody(lifecycle.status()));

  allowOnly(app, '/engine/drain', ['POST']);
  app.post<{ Body: DrainBody | undefined }>(
    '/engine/drain',
    { schema: { body: DrainBodySchema } },
    async (req, reply) => {
      guardAdmin?.(req.headers.authorization);
      const status = await lifecycle.drain(req.body?.reason ?? 'admin', { deadlineMs: req.body?.deadline_ms });
      return reply.code(status.state === 'drained' ? 200 : 202).send(statusBody(status));
    },
  );

  allowOnly(app, '/engine/resume', ['POST']);
  app.post('/engine/resume', { schema: { body: EmptyBodySchema } }, async (req) => {
    guardAdmin?.(req.headers.authorization);
    return statusBody(await lifecycle.resume());
  });

  return app;
}
