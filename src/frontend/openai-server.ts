import type { FastifyInstance, FastifyReply } from 'fastify';
import type { ServerResponse } from 'node:http';
import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import { allowOnly, createHttpServer } from '../common/http-server.js';
import { writeWithBackpressure } from '../common/backpressure.js';
import type { GenerateBody, StreamLine, Usage } from '../protocol/request-plane.js';
import type { FrontendMetrics } from './metrics.js';
import { completionResponse, SseFormatter, toGenerateBody, type Endpoint } from './openai-format.js';
import { chatCompletionSchema, completionSchema, type OpenAIRequest } from './openai-schema.js';
import { MidStreamFailure, modelNotFound, StreamCut, WorkerStreamError, type Upstream, type UpstreamStream } from './upstream.js';
import { errorBody } from '../protocol/errors.js';
import type { HttpServerLimits } from '../common/http-server.js';
import type { WorkerPool } from './worker-pool.js';

export interface OpenAIServerDeps {
  pool: WorkerPool;
  upstream: Upstream;
  metrics: FrontendMetrics;
  log: Logger;
  limits?: HttpServerLimits | undefined;
}


/**
 * A header value for a worker id: ids are operator-chosen and not checked against RFC 9110, so one
 * with characters a header cannot carry is sent percent-encoded rather than break the response.
 */
export function headerValue(value: string): string {
  return /^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$/.test(value) ? value : encodeURIComponent(value);
}

/** Aborts when the client goes away before the response finished. */
function clientGone(reply: FastifyReply): AbortSignal {
  const controller = new AbortController();
  reply.raw.on('close', () => {
    if (!reply.raw.writableFinished) controller.abort(new Error('client disconnected'));
  });
  return controller.signal;
}

/** The public OpenAI-compatible API. No admin route lives here. */
export function createOpenAIServer({ pool, upstream, metrics, log, limits }: OpenAIServerDeps): FastifyInstance {
  const app = createHttpServer({ role: 'public', ...limits });
  app.addHook('onResponse', async (req, reply) => {
    const url = req.routeOptions.url;
    if (url === '/v1/chat/completions' || url === '/v1/completions') metrics.request(url, reply.statusCode);
  });

  allowOnly(app, '/v1/models', ['GET']);
  app.get('/v1/models', async () => ({
    object: 'list',
    data: pool.models().map((id) => ({ id, object: 'model', created: 0, owned_by: 'ebb' })),
  }));

  allowOnly(app, '/health', ['GET']);
  app.get('/health', async () => ({ status: 'ok', workers: pool.size, models: pool.models() }));

  allowOnly(app, '/metrics', ['GET']);
  app.get('/metrics', async (_req, reply) => reply.header('content-type', metrics.registry.contentType).send(await metrics.registry.metrics()));

  const route = (endpoint: Endpoint, url: string, schema: object) => {
    allowOnly(app, url, ['POST']);
    app.post<{ Body: OpenAIRequest }>(url, { schema: { body: schema } }, async (req, reply) => {
      const body = req.body;
      if (!pool.hasModel(body.model)) throw modelNotFound(body.model);
      const id = `${endpoint === 'chat' ? 'chatcmpl' : 'cmpl'}-${randomUUID().replaceAll('-', '')}`; // randomUUID: pooled entropy, ~20x cheaper than randomBytes
      const gen = toGenerateBody(endpoint, body, id);
      const signal = clientGone(reply);
      const started = performance.now();
      if (body.stream) {
        const up = await open(gen, signal);
        // From here the relay owns the upstream stream: every way out releases it.
        await relay(reply, new SseFormatter(endpoint, id, body.model), up, body.stream_options?.include_usage === true, signal, started);
        return;
      }
      const { text, finishReason, usage } = await collect(gen, signal);
      return completionResponse(endpoint, id, body.model, text, finishReason, usage);
    });
  };
  route('chat', '/v1/chat/completions', chatCompletionSchema);
  route('completion', '/v1/completions', completionSchema);

  function open(gen: GenerateBody, signal: AbortSignal, tried?: Set<string>): Promise<UpstreamStream> {
    return pool.servingPath(gen.model) === 'disaggregated' ? upstream.openDisaggregated(gen, signal, tried) : upstream.open(gen, 'aggregated', signal, tried);
  }

  /**
   * Streams a committed response, and owns `up` from its first line: the one finally releases it
   * whichever way this ends (header write failing, client gone, worker failing, success). A worker
   * failing after the headers can only be reported: tokens already left.
   */
  async function relay(reply: FastifyReply, fmt: SseFormatter, up: UpstreamStream, includeUsage: boolean, signal: AbortSignal, started: number): Promise<void> {
    const res = reply.raw;
    const workerId = up.worker.record.worker_id;
    let out = '';
    try {
      metrics.firstToken((performance.now() - started) / 1000);
      reply.hijack();
      res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'x-ebb-worker-id': headerValue(workerId) });
      out = fmt.opening(); // tokens of the current batch, written together
      for (let batch: StreamLine[] | undefined = up.first; batch; batch = (await up.rest.next()).value ?? undefined) {
        for (const line of batch) {
          if ('text' in line) out += fmt.token(line.text);
          else if ('done' in line) {
            res.end(out + fmt.finish(line.finish_reason, includeUsage ? line.usage : undefined));
            return;
          } else throw new WorkerStreamError(line.error);
        }
        await writeWithBackpressure(res, out, signal);
        out = '';
      }
      throw new StreamCut();
    } catch (err) {
      if (!signal.aborted) fail(res, workerId, err, out, fmt);
    } finally {
      up.release();
      // The client left; releasing the upstream request freed the worker's slot.
      if (signal.aborted) log.info({ event: 'client_gone', worker_id: workerId }, `client left a stream on ${workerId}`);
    }
  }

  /** Ends a stream that broke: an SSE error event when it had started, a JSON 500 when it never could. */
  function fail(res: ServerResponse, workerId: string, err: unknown, out: string, fmt: SseFormatter): void {
    try {
      if (!res.headersSent) {
        log.error({ event: 'response_failed', worker_id: workerId, err: (err as Error).message }, `could not start the response: ${(err as Error).message}`);
        res.writeHead(500, { 'content-type': 'application/json; charset=utf-8' });
        res.end(JSON.stringify(errorBody('internal_error', `could not start the response: ${(err as Error).message}`)));
        return;
      }
      const failure = new MidStreamFailure(workerId, err);
      metrics.midStreamFailure();
      log.warn({ event: 'midstream_failure', worker_id: workerId, code: failure.code, err: failure.message }, failure.message);
      res.end(out + fmt.error(failure.code, failure.message));
    } catch {
      res.destroy();
    }
  }

  /**
   * Non-streaming: nothing reaches the client until the end, so even a worker that dies half way
   * is retried on another worker from the start.
   */
  async function collect(gen: GenerateBody, signal: AbortSignal): Promise<{ text: string; finishReason: string; usage: Usage }> {
    const tried = new Set<string>();
    for (;;) {
      const up = await open(gen, signal, tried);
      try {
        let text = '';
        for (let batch: StreamLine[] | undefined = up.first; batch; batch = (await up.rest.next()).value ?? undefined) {
          for (const line of batch) {
            if ('text' in line) text += line.text;
            else if ('done' in line) return { text, finishReason: line.finish_reason, usage: line.usage };
            else throw new WorkerStreamError(line.error);
          }
        }
        throw new StreamCut();
      } catch (err) {
        if (signal.aborted) throw err;
        log.warn({ event: 'retry_after_failure', worker_id: up.worker.record.worker_id, err: (err as Error).message }, 'worker failed; retrying elsewhere');
      } finally {
        up.release();
      }
    }
  }

  return app;
}
