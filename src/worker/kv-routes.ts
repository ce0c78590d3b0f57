import type { FastifyInstance } from 'fastify';
import { createReadStream } from 'node:fs';
import { allowOnly } from '../common/http-server.js';
import type { Engine } from '../engine/engine.js';
import { EbbError } from '../protocol/errors.js';
import { GenerateBodySchema, type GenerateBody, type PrefillResponse } from '../protocol/request-plane.js';
import type { WorkerMode } from '../protocol/worker-mode.js';
import type { Generations } from './generation.js';
import { KV_STATE_HEADER } from './kv-state-wire.js';
import type { RequestGate } from './request-gate.js';
import { ATTR } from '../tracing/attributes.js';
import { traceWorkerRequest } from '../tracing/worker-trace.js';

export interface KvRoutesDeps {
  workerId: string;
  model: string;
  mode: WorkerMode;
  engine: Engine;
  selfUrl: () => string;
  gate: RequestGate;
  generations: Generations;
}

/**
 * Disaggregated serving's routes: POST /prefill (a prefill worker computes a prompt's KV and keeps
 * it as a transfer) and GET/DELETE /kv/:id (a decode worker, or a hand-off's next worker, pulls a
 * transfer; the frontend frees one nobody will pull).
 */
export function addKvRoutes(app: FastifyInstance, { workerId, model, mode, engine, selfUrl, gate, generations }: KvRoutesDeps): void {
  if (engine.prefill && engine.kvTransfers && (mode === 'prefill' || !engine.kvPayload)) {
    const prefill = engine.prefill.bind(engine);
    const transfers = engine.kvTransfers;
    allowOnly(app, '/prefill', ['POST']);
    app.post<{ Body: GenerateBody }>('/prefill', { schema: { body: GenerateBodySchema } }, async (req, reply) => {
      const admitted = gate.admit(req.body, reply.raw, traceWorkerRequest(req.raw, reply.raw, '/prefill', workerId, model));
      if ('refused' in admitted) return gate.refuse(reply, admitted.refused);
      const { gen, scope } = admitted;
      reply.hijack();
      try {
        const t = await prefill(gen, scope.signal);
        scope.trace?.span.setAttributes({ [ATTR.transferId]: t.transfer_id, [ATTR.kvBytes]: t.kv_bytes, [ATTR.inputTokens]: t.prompt_tokens });
        const body: PrefillResponse = { transfer_id: t.transfer_id, source_url: selfUrl(), worker_id: workerId, prompt_tokens: t.prompt_tokens, kv_bytes: t.kv_bytes, ...(t.cached_tokens !== undefined ? { cached_tokens: t.cached_tokens } : {}) };
        // The caller left while the KV was computed: nobody will pull it.
        if (scope.dropped) transfers.complete(t.transfer_id);
        else {
          reply.raw.writeHead(200, { 'content-type': 'application/json' });
          scope.end(JSON.stringify(body), 'completed');
        }
      } catch (err) {
        generations.failed(scope, err);
      }
    });
  }

  if (engine.kvTransfers) {
    const transfers = engine.kvTransfers;
    // Transfers are served while draining too: the KV was computed for requests already admitted
    // (a prefill's, or a stream's handed off at the drain deadline).
    allowOnly(app, '/kv/:id', ['GET', 'DELETE']);
    app.get<{ Params: { id: string } }>('/kv/:id', async (req, reply) => {
      // The KV leaving this worker for the one that continues from it: a span in the puller's trace.
      traceWorkerRequest(req.raw, reply.raw, '/kv/:id', workerId, model)?.span.setAttribute(ATTR.transferId, req.params.id);
      const t = transfers.get(req.params.id);
      if (!t) throw new EbbError('kv_transfer_not_found', `no pending KV transfer ${req.params.id} (completed or expired)`);
      if (!engine.kvPayload) return reply.header('content-type', 'application/octet-stream').send(Buffer.alloc(t.kv_bytes, 0x6b));
      const payload = engine.kvPayload(req.params.id);
      if (!payload) throw new EbbError('kv_transfer_not_found', `no pending KV transfer ${req.params.id} (completed or expired)`);
      return reply.header('content-type', 'application/octet-stream').header('content-length', payload.bytes).header(KV_STATE_HEADER, payload.header).send(createReadStream(payload.path));
    });
    app.delete<{ Params: { id: string } }>('/kv/:id', async (req, reply) => {
      if (!transfers.complete(req.params.id)) throw new EbbError('kv_transfer_not_found', `no pending KV transfer ${req.params.id}`);
      return reply.code(204).send();
    });
  }
}
