import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { decodeVector } from '../../protocol/embedding-vector.js';
import { EbbError } from '../../protocol/errors.js';
import type { EmbedBody, EmbedResponse } from '../../protocol/request-plane.js';
import { headerValue } from '../relay/relay.js';
import type { Upstream } from '../relay/upstream.js';
import type { WorkerPool } from '../routing/worker-pool.js';
import { Shutdown } from '../shutdown.js';
import { embeddingsSchema, type EmbeddingsRequest } from './embeddings-schema.js';
import type { Spend } from '../limits/limiter.js';
import { EMBEDDINGS_FIELD_POLICY, type FieldPolicy } from './field-policy.js';
import { promptShape } from './prompt-shape.js';

export interface EmbeddingsRouteDeps {
  pool: WorkerPool;
  upstream: Upstream;
  shutdown: Shutdown;
  /** The generating routes' first check: a model somebody serves, and fields the fleet can honour. */
  admit: (body: { model: string }, table: FieldPolicy) => void;
  /** Its reservation of its tenant's limits (--limits-file; its inputs' tokens); undefined: no limits. */
  limit: (body: EmbedBody, req: FastifyRequest, reply: FastifyReply) => Promise<Spend | undefined>;
  /** Room for the request's one upstream call, held until its response is done (its reservation settles then). */
  holdLane: (reply: FastifyReply, model: string, spend: Spend | undefined) => void;
  /** Its ticket for the admission queue (none without a queue). */
  ticket: (body: EmbedBody, req: FastifyRequest, spend: Spend | undefined) => void;
}

/** The request plane's inputs: always a list, of texts or of token-id arrays. */
function inputsOf(input: EmbeddingsRequest['input']): EmbedBody['input'] {
  const shape = promptShape(input);
  return (shape === 'text' || shape === 'ids' ? [input] : input) as EmbedBody['input'];
}

/**
 * OpenAI's answer from the worker's: vectors as the worker sent them (base64 float32) when the
 * client asked for base64, else decoded to numbers. A worker whose answer does not match the
 * request (count, order, bytes) is a protocol error, never passed on.
 */
function embeddingsResponse(model: string, base64: boolean, answer: EmbedResponse, inputs: number, workerId: string) {
  const bad = (why: string) => new EbbError('worker_protocol_error', `worker ${workerId} answered an embedding that ${why}`);
  if (!Array.isArray(answer.data) || answer.data.length !== inputs) throw bad(`has ${Array.isArray(answer.data) ? answer.data.length : 'no'} vectors for ${inputs} inputs`);
  const data = answer.data.map((d, i) => {
    if (d.index !== i || typeof d.embedding !== 'string') throw bad(`is out of order or not base64 at ${i}`);
    if (base64) return { object: 'embedding', index: i, embedding: d.embedding };
    const v = decodeVector(d.embedding);
    if (v === undefined) throw bad(`is not float32 at ${i}`);
    return { object: 'embedding', index: i, embedding: Array.from(v) };
  });
  const tokens = answer.usage?.prompt_tokens ?? 0;
  return { object: 'list', data, model, usage: { prompt_tokens: tokens, total_tokens: tokens } };
}

export function addEmbeddingsRoute(app: FastifyInstance, { pool, upstream, shutdown, admit, limit, holdLane, ticket }: EmbeddingsRouteDeps): void {
  app.post<{ Body: EmbeddingsRequest }>('/v1/embeddings', { schema: { body: embeddingsSchema } }, async (req, reply) => {
    const body = req.body;
    // Before the fields: what a model that cannot embed at all lacks is the whole route, not a field.
    if (pool.hasModel(body.model) && !pool.declares(body.model, 'embeddings')) {
      const engines = pool.engineKinds(body.model).join(', ') || 'unknown';
      throw new EbbError('unsupported_parameter', `model "${body.model}" has no worker that serves embeddings (engines: ${engines}); see docs/api.md, "Embeddings", for the engines that do`, { param: 'model' });
    }
    // An adapter's model is its base model's, tuned to generate: its vectors would be the base model's under its name.
    const adapter = pool.hasModel(body.model) ? undefined : pool.adapterBase(body.model);
    if (adapter !== undefined)
      throw new EbbError('unsupported_parameter', `"${body.model}" is a LoRA adapter of "${adapter.base}": adapters do not embed; ask "${adapter.base}" for embeddings`, { param: 'model' });
    admit(body, EMBEDDINGS_FIELD_POLICY);
    const input = inputsOf(body.input);
    // The answer's x-request-id (a sane id, set on every request): the worker's logs name the request by it.
    const requestId = String(reply.raw.getHeader('x-request-id'));
    const sent: EmbedBody = { model: body.model, input, request_id: requestId, ...(body.dimensions != null && { dimensions: body.dimensions }) };
    const spend = await limit(sent, req, reply);
    holdLane(reply, body.model, spend);
    const signal = shutdown.requestSignal(reply.raw);
    try {
      ticket(sent, req, spend);
      const { worker, answer } = await upstream.embed(sent, signal);
      if (answer.usage?.prompt_tokens !== undefined) spend?.used(answer.usage.prompt_tokens);
      void reply.header('x-ebb-worker-id', headerValue(worker.record.worker_id));
      return embeddingsResponse(body.model, body.encoding_format === 'base64', answer, input.length, worker.record.worker_id);
    } catch (err) {
      throw Shutdown.cutReason(signal) ?? err;
    }
  });
}
