import type { FastifyInstance } from 'fastify';
import { allowOnly } from '../common/http-server.js';
import type { Engine } from '../engine/engine.js';
import { encodeVector } from '../protocol/embedding-vector.js';
import { EmbedBodySchema, type EmbedBody, type EmbedResponse } from '../protocol/request-plane.js';
import type { Generations } from './generation.js';
import type { WorkerMetrics } from './metrics.js';
import type { RequestGate } from './request-gate.js';
import { checkEmbeddingTokens } from './embedding-tokens.js';
import { traceWorkerRequest } from '../tracing/worker-trace.js';

export interface EmbedRouteDeps {
  workerId: string;
  model: string;
  engine: Engine;
  gate: RequestGate;
  generations: Generations;
  metrics: WorkerMetrics;
  /** The most tokens one request's inputs may carry together (--max-embedding-tokens). */
  maxTokens: number;
}

/**
 * POST /embed: admitted through the gate as a /generate is (a draining worker refuses it, a drain
 * waits for it), its scope open until the answer is flushed; failures answered as a generation's
 * are before its first byte. Not handed off at a drain deadline: like a prefill, it finishes where it runs.
 * Its inputs' tokens are bounded (embedding-tokens.ts): past the bound it is refused before any work.
 */
export function addEmbedRoute(app: FastifyInstance, { workerId, model, engine, gate, generations, metrics, maxTokens }: EmbedRouteDeps): void {
  const embed = engine.embed?.bind(engine);
  const tokenize = engine.tokenize?.bind(engine);
  allowOnly(app, '/embed', ['POST']);
  app.post<{ Body: EmbedBody }>('/embed', { schema: { body: EmbedBodySchema } }, async (req, reply) => {
    const body = req.body;
    // An engine without embed() declares no `embeddings`: the gate answers 400 before admission.
    const admitted = gate.admitEmbedding(body, reply.raw, traceWorkerRequest(req.raw, reply.raw, '/embed', workerId, model));
    if ('refused' in admitted) return gate.refuse(reply, admitted.refused);
    const { scope } = admitted;
    reply.hijack();
    try {
      if (embed === undefined) throw new Error(`the engine (${engine.kind}) declares embeddings but cannot embed`);
      await checkEmbeddingTokens(body.input, maxTokens, tokenize, scope.signal);
      const result = await embed(body.input, { dimensions: body.dimensions }, scope.signal);
      if (result.vectors.length !== body.input.length) throw new Error(`the engine answered ${result.vectors.length} vectors for ${body.input.length} inputs`);
      metrics.embedded(body.input.length);
      const answer: EmbedResponse = {
        data: result.vectors.map((v, index) => ({ index, embedding: encodeVector(v) })),
        usage: { prompt_tokens: result.prompt_tokens, total_tokens: result.prompt_tokens },
      };
      scope.res.writeHead(200, { 'content-type': 'application/json', 'x-request-id': scope.id });
      scope.end(JSON.stringify(answer), 'completed');
    } catch (err) {
      generations.failed(scope, err);
    }
  });
}
