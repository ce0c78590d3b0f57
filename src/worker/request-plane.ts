import type { FastifyInstance } from 'fastify';
import type { ServerResponse } from 'node:http';
import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import { allowOnly, createHttpServer } from '../common/http-server.js';
import { writeWithBackpressure } from '../common/backpressure.js';
import { EbbError, errorBody, type ErrorCode } from '../protocol/errors.js';
import type { Engine, GenerateRequest, GenerateResult } from '../engine/engine.js';
import type { Admission, RefusalCode, Ticket } from '../lifecycle/admission.js';
import type { WorkerMetrics } from './metrics.js';
import { DEFAULT_MAX_TOKENS, GenerateBodySchema as generateBodySchema, promptOf, type GenerateBody, type KvTransferRef, type PrefillResponse, type StreamLine } from '../protocol/request-plane.js';
import { KvPullError, pullKv } from './kv-pull.js';

export interface RequestPlaneDeps {
  model: string;
  workerId: string;
  engine: Engine;
  admission: Admission;
  metrics: WorkerMetrics;
  log: Logger;
  /** This request plane's own URL, the source decode peers pull KV from. */
  selfUrl: () => string;
}

function usageOf(r: GenerateResult) {
  return { prompt_tokens: r.prompt_tokens, completion_tokens: r.completion_tokens, total_tokens: r.prompt_tokens + r.completion_tokens };
}


/** The worker's request plane: POST /generate, admission-checked before any work is done. */
export function createRequestPlane({ model, workerId, engine, admission, metrics, log, selfUrl }: RequestPlaneDeps): FastifyInstance {
  const app = createHttpServer();

  /** Validation shared by /generate and /prefill, then the one admission point. */
  function admit(body: GenerateBody): { gen: GenerateRequest; ticket: Ticket } | { refused: RefusalCode } {
    if (body.model !== model) throw new EbbError('model_not_found', `this worker serves "${model}", not "${body.model}"`);
    const prompt = promptOf(body);
    if (prompt === undefined) throw new EbbError('invalid_request', 'either prompt or messages is required');
    const requestId = body.request_id ?? randomUUID();
    const admitted = admission.admit(requestId);
    if (!admitted.admitted) {
      metrics.refused(admitted.code);
      return { refused: admitted.code };
    }
    const gen: GenerateRequest = {
      request_id: requestId,
      prompt,
      max_tokens: body.max_tokens ?? DEFAULT_MAX_TOKENS,
      temperature: body.temperature ?? 1,
      seed: body.seed,
      stop: typeof body.stop === 'string' ? [body.stop] : body.stop,
      prefilled: body.kv_transfer !== undefined,
    };
    return { gen, ticket: admitted.ticket };
  }

  function refusal(code: 'worker_draining' | 'worker_overloaded') {
    const why = code === 'worker_draining' ? 'worker is draining; retry on another worker' : 'worker is overloaded; retry shortly or elsewhere';
    return errorBody(code, why);
  }

  /** Aborts generation when the caller goes away, and releases its ticket as dropped (once). */
  function watchCaller(res: ServerResponse, ticket: Ticket): AbortSignal {
    const abort = new AbortController();
    res.on('close', () => {
      if (res.writableFinished) return;
      abort.abort(new Error('client disconnected'));
      if (ticket.release('dropped')) log.debug({ request_id: ticket.id }, 'client dropped the request');
    });
    return abort.signal;
  }

  allowOnly(app, '/generate', ['POST']);
  app.post<{ Body: GenerateBody }>('/generate', { schema: { body: generateBodySchema } }, async (req, reply) => {
    const admitted = admit(req.body);
    if ('refused' in admitted) return reply.code(503).header('retry-after', '1').send(refusal(admitted.refused));
    reply.hijack();
    await serve(reply.raw, admitted.gen, req.body.stream !== false, admitted.ticket, req.body.kv_transfer);
  });

  if (engine.prefill && engine.kvTransfers) {
    const prefill = engine.prefill.bind(engine);
    const transfers = engine.kvTransfers;
    allowOnly(app, '/prefill', ['POST']);
    app.post<{ Body: GenerateBody }>('/prefill', { schema: { body: generateBodySchema } }, async (req, reply) => {
      const admitted = admit(req.body);
      if ('refused' in admitted) return reply.code(503).header('retry-after', '1').send(refusal(admitted.refused));
      const { gen, ticket } = admitted;
      const signal = watchCaller(reply.raw, ticket);
      try {
        const t = await prefill(gen, signal);
        const body: PrefillResponse = { transfer_id: t.transfer_id, source_url: selfUrl(), worker_id: workerId, prompt_tokens: t.prompt_tokens, kv_bytes: t.kv_bytes };
        reply.raw.once('finish', () => ticket.release('completed'));
        return body;
      } catch (err) {
        if (!signal.aborted) ticket.release('errored');
        throw err;
      }
    });

    // Transfers are served while draining too: the KV was computed for requests already admitted.
    allowOnly(app, '/kv/:id', ['GET', 'DELETE']);
    app.get<{ Params: { id: string } }>('/kv/:id', async (req, reply) => {
      const t = transfers.get(req.params.id);
      if (!t) throw new EbbError('kv_transfer_not_found', `no pending KV transfer ${req.params.id} (completed or expired)`);
      return reply.header('content-type', 'application/octet-stream').send(Buffer.alloc(t.kv_bytes, 0x6b));
    });
    app.delete<{ Params: { id: string } }>('/kv/:id', async (req, reply) => {
      if (!transfers.complete(req.params.id)) throw new EbbError('kv_transfer_not_found', `no pending KV transfer ${req.params.id}`);
      return reply.code(204).send();
    });
  }

  /** Owns the ticket from here: exactly one release, whoever ends the request. */
  async function serve(res: ServerResponse, gen: GenerateRequest, stream: boolean, ticket: Ticket, kv: KvTransferRef | undefined): Promise<void> {
    const signal = watchCaller(res, ticket);
    let tokens: AsyncGenerator<string, GenerateResult, void> | undefined;
    try {
      if (kv) {
        const bytes = await pullKv(kv, signal);
        log.debug({ event: 'kv_pulled', request_id: ticket.id, transfer_id: kv.transfer_id, kv_bytes: bytes }, 'KV pulled from prefill worker');
      }
      tokens = engine.generate(gen, signal);
      if (stream) {
        res.writeHead(200, { 'content-type': 'application/x-ndjson', 'cache-control': 'no-cache', 'x-request-id': ticket.id });
        res.flushHeaders(); // "admitted and alive" reaches the caller now, not with the first token
        let step = await tokens.next();
        while (!step.done) {
          await writeWithBackpressure(res, JSON.stringify({ text: step.value } satisfies StreamLine) + '\n', signal);
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
      if (signal.aborted) return; // the client left; released as dropped
      log.error({ err, request_id: ticket.id }, 'generation failed');
      const kvFailed = err instanceof KvPullError;
      const error: { code: ErrorCode; message: string } = { code: kvFailed ? 'kv_transfer_failed' : 'engine_error', message: (err as Error).message };
      if (!res.headersSent) {
        res.writeHead(kvFailed ? 502 : 500, { 'content-type': 'application/json' });
        res.end(JSON.stringify(errorBody(error.code, error.message)), () => ticket.release('errored'));
      } else {
        res.end(JSON.stringify({ error } satisfies StreamLine) + '\n', () => ticket.release('errored'));
      }
    } finally {
      // A generator left suspended at a yield would keep its batch slot: close it on every way out.
      void tokens?.return(undefined as never).catch(() => undefined);
    }
  }

  return app;
}
