import type { FastifyInstance } from 'fastify';
import type { ServerResponse } from 'node:http';
import { once } from 'node:events';
import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import { allowOnly, createHttpServer } from '../common/http-server.js';
import { errorBody, HttpError } from '../common/errors.js';
import type { Engine, GenerateRequest, GenerateResult } from '../engine/engine.js';
import type { Admission, Ticket } from '../lifecycle/admission.js';
import type { WorkerMetrics } from './metrics.js';
import { DEFAULT_MAX_TOKENS, generateBodySchema, promptOf, type GenerateBody, type StreamLine } from './protocol.js';

export interface RequestPlaneDeps {
  model: string;
  engine: Engine;
  admission: Admission;
  metrics: WorkerMetrics;
  log: Logger;
}

function usageOf(r: GenerateResult) {
  return { prompt_tokens: r.prompt_tokens, completion_tokens: r.completion_tokens, total_tokens: r.prompt_tokens + r.completion_tokens };
}

async function write(res: ServerResponse, chunk: string): Promise<void> {
  if (!res.write(chunk)) await once(res, 'drain');
}

/** The worker's request plane: POST /generate, admission-checked before any work is done. */
export function createRequestPlane({ model, engine, admission, metrics, log }: RequestPlaneDeps): FastifyInstance {
  const app = createHttpServer();
  allowOnly(app, '/generate', ['POST']);

  app.post<{ Body: GenerateBody }>('/generate', { schema: { body: generateBodySchema } }, async (req, reply) => {
    const body = req.body;
    if (body.model !== model) throw new HttpError(404, 'model_not_found', `this worker serves "${model}", not "${body.model}"`);
    const prompt = promptOf(body);
    if (prompt === undefined) throw new HttpError(400, 'invalid_request', 'either prompt or messages is required');

    const requestId = body.request_id ?? randomUUID();
    const admitted = admission.admit(requestId);
    if (!admitted.admitted) {
      metrics.refused(admitted.code);
      const why = admitted.code === 'worker_draining' ? 'worker is draining; retry on another worker' : 'worker is overloaded; retry shortly or elsewhere';
      return reply
        .code(503)
        .header('retry-after', '1')
        .send(errorBody(admitted.code, why, 'service_unavailable', { retryable: true }));
    }

    const gen: GenerateRequest = {
      request_id: requestId,
      prompt,
      max_tokens: body.max_tokens ?? DEFAULT_MAX_TOKENS,
      temperature: body.temperature ?? 1,
      seed: body.seed,
      stop: typeof body.stop === 'string' ? [body.stop] : body.stop,
    };
    reply.hijack();
    await serve(reply.raw, gen, body.stream !== false, admitted.ticket);
  });

  /** Owns the ticket from here: exactly one release, whoever ends the request. */
  async function serve(res: ServerResponse, gen: GenerateRequest, stream: boolean, ticket: Ticket): Promise<void> {
    const abort = new AbortController();
    res.on('close', () => {
      if (res.writableFinished) return;
      abort.abort(new Error('client disconnected'));
      if (ticket.release('dropped')) log.debug({ request_id: ticket.id }, 'client dropped the stream');
    });
    const tokens = engine.generate(gen, abort.signal);
    try {
      if (stream) {
        res.writeHead(200, { 'content-type': 'application/x-ndjson', 'cache-control': 'no-cache', 'x-request-id': ticket.id });
        let step = await tokens.next();
        while (!step.done) {
          await write(res, JSON.stringify({ text: step.value } satisfies StreamLine) + '\n');
          step = await tokens.next();
        }
        const last: StreamLine = { done: true, finish_reason: step.value.finish_reason, usage: usageOf(step.value) };
        res.end(JSON.stringify(last) + '\n', () => ticket.release('completed'));
      } else {
        let text = '';
        let step = await tokens.next();
        while (!step.done) {
          text += step.value;
          step = await tokens.next();
        }
        const payload = JSON.stringify({ text, finish_reason: step.value.finish_reason, usage: usageOf(step.value) });
        res.writeHead(200, { 'content-type': 'application/json', 'x-request-id': ticket.id });
        res.end(payload, () => ticket.release('completed'));
      }
    } catch (err) {
      if (abort.signal.aborted) return; // the client left; released as dropped
      log.error({ err, request_id: ticket.id }, 'generation failed');
      const error = { code: 'engine_error', message: (err as Error).message };
      if (!res.headersSent) {
        res.writeHead(500, { 'content-type': 'application/json' });
        res.end(JSON.stringify(errorBody(error.code, error.message, 'server_error')), () => ticket.release('errored'));
      } else {
        res.end(JSON.stringify({ error } satisfies StreamLine) + '\n', () => ticket.release('errored'));
      }
    }
  }

  return app;
}
