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
import { MidStreamFailure, modelNotFound, type Upstream, type UpstreamStream } from './upstream.js';
import type { WorkerPool } from './worker-pool.js';

export interface OpenAIServerDeps {
  pool: WorkerPool;
  upstream: Upstream;
  metrics: FrontendMetrics;
  log: Logger;
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
export function createOpenAIServer({ pool, upstream, metrics, log }: OpenAIServerDeps): FastifyInstance {
  const app = createHttpServer();
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
        metrics.firstToken((performance.now() - started) / 1000);
        reply.hijack();
        await relay(reply.raw, new SseFormatter(endpoint, id, body.model), up, body.stream_options?.include_usage === true, signal);
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

  /** Streams a committed response. A worker failing now can only be reported: tokens already left. */
  async function relay(res: ServerResponse, fmt: SseFormatter, up: UpstreamStream, includeUsage: boolean, signal: AbortSignal): Promise<void> {
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'x-ebb-worker-id': up.worker.record.worker_id });
    let out = fmt.opening(); // tokens of the current batch, written together
    try {
      for (let batch: StreamLine[] | undefined = up.first; batch; batch = (await up.rest.next()).value ?? undefined) {
        for (const line of batch) {
          if ('text' in line) out += fmt.token(line.text);
          else if ('done' in line) {
            res.end(out + fmt.finish(line.finish_reason, includeUsage ? line.usage : undefined));
            return;
          } else throw new Error(line.error.message);
        }
        await writeWithBackpressure(res, out, signal);
        out = '';
      }
      throw new Error('stream ended without a final line');
    } catch (err) {
      if (signal.aborted) return; // the client left; the aborted upstream request frees the worker's slot
      const failure = new MidStreamFailure(up.worker.record.worker_id, err);
      metrics.midStreamFailure();
      log.warn({ event: 'midstream_failure', worker_id: up.worker.record.worker_id, err: failure.message }, failure.message);
      res.end(out + fmt.error('worker_failed_mid_stream', failure.message));
    } finally {
      up.release();
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
            else throw new Error(line.error.message);
          }
        }
        throw new Error('stream ended without a final line');
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
