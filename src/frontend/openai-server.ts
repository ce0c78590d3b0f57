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
import { HandedOff, MidStreamFailure, unavailableModel, StreamCut, WorkerStreamError, WorkerUnresponsive, type Upstream, type UpstreamStream } from './upstream.js';
import { Delivered, type MigrationReason } from './migration.js';
import { checkFields } from './field-policy.js';
import { EbbError, errorBody } from '../protocol/errors.js';
import type { HttpServerLimits } from '../common/http-server.js';
import type { WorkerPool } from './worker-pool.js';

export interface OpenAIServerDeps {
  pool: WorkerPool;
  upstream: Upstream;
  metrics: FrontendMetrics;
  log: Logger;
  limits?: HttpServerLimits | undefined;
  /** How many times one request may move to another worker mid-stream (default 3; 0 disables). */
  migrationLimit?: number | undefined;
}

export const DEFAULT_MIGRATION_LIMIT = 3;


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
export function createOpenAIServer({ pool, upstream, metrics, log, limits, migrationLimit = DEFAULT_MIGRATION_LIMIT }: OpenAIServerDeps): FastifyInstance {
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
      if (!pool.hasModel(body.model)) throw unavailableModel(pool, body.model);
      checkFields(body as unknown as Record<string, unknown>, pool);
      const id = `${endpoint === 'chat' ? 'chatcmpl' : 'cmpl'}-${randomUUID().replaceAll('-', '')}`; // randomUUID: pooled entropy, ~20x cheaper than randomBytes
      const gen = toGenerateBody(endpoint, body, id);
      const signal = clientGone(reply);
      const started = performance.now();
      if (body.stream) {
        const tried = new Set<string>();
        const up = await open(gen, signal, tried);
        // From here the relay owns the upstream stream: every way out releases it.
        await relay(reply, new SseFormatter(endpoint, id, body.model), gen, up, tried, body.stream_options?.include_usage === true, signal, started);
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
   * Streams a committed response, and owns the upstream stream from its first line: the one finally
   * releases whichever stream is current, however this ends. A worker that fails or hands off
   * mid-stream is replaced by another that continues from what was delivered, into the same client
   * stream; only when none can is the stream ended, with an error event saying why.
   */
  async function relay(
    reply: FastifyReply,
    fmt: SseFormatter,
    gen: GenerateBody,
    first: UpstreamStream,
    tried: Set<string>,
    includeUsage: boolean,
    signal: AbortSignal,
    started: number,
  ): Promise<void> {
    const res = reply.raw;
    const delivered = new Delivered();
    let up = first;
    let out = '';
    try {
      metrics.firstToken((performance.now() - started) / 1000);
      reply.hijack();
      res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'x-ebb-worker-id': headerValue(up.worker.record.worker_id) });
      out = fmt.opening(); // tokens of the current batch, written together
      for (;;) {
        try {
          for (let batch: StreamLine[] | undefined = up.first; batch; batch = (await up.rest.next()).value ?? undefined) {
            for (const line of batch) {
              if ('text' in line) {
                out += fmt.token(line.text);
                delivered.add(line.text, line.token_ids);
              } else if ('done' in line) {
                res.end(out + fmt.finish(line.finish_reason, includeUsage ? delivered.usage(line.usage) : undefined));
                return;
              } else throw endOf(up, line);
            }
            await writeWithBackpressure(res, out, signal);
            out = '';
          }
          throw new StreamCut();
        } catch (err) {
          if (signal.aborted) return;
          const next = await continueElsewhere(gen, delivered, up, err, tried, signal);
          if (!('worker' in next)) return fail(res, up.worker.record.worker_id, err, out, fmt, next.notContinued);
          up = next;
        }
      }
    } catch (err) {
      if (!signal.aborted) fail(res, up.worker.record.worker_id, err, out, fmt);
    } finally {
      up.release();
      // The client left; releasing the upstream request freed the worker's slot.
      if (signal.aborted) log.info({ event: 'client_gone', worker_id: up.worker.record.worker_id }, `client left a stream on ${up.worker.record.worker_id}`);
    }
  }

  /** A terminal line other than done: the error the stream loop ends with. */
  function endOf(up: UpstreamStream, line: StreamLine): Error {
    return 'handoff' in line ? new HandedOff(up.worker.record.worker_id) : new WorkerStreamError((line as { error: { code: never; message: string } }).error);
  }

  /**
   * Moves a broken (or handed-off) request to another serving worker, which continues from what was
   * delivered. Resolves with the new stream, or with why it could not be continued.
   */
  async function continueElsewhere(
    gen: GenerateBody,
    delivered: Delivered,
    from: UpstreamStream,
    err: unknown,
    tried: Set<string>,
    signal: AbortSignal,
  ): Promise<UpstreamStream | { notContinued: string }> {
    from.release();
    const fromId = from.worker.record.worker_id;
    const reason: MigrationReason = err instanceof HandedOff ? 'handoff' : err instanceof WorkerUnresponsive ? 'worker_unresponsive' : 'worker_failed';
    if (delivered.migrations >= migrationLimit) {
      metrics.migrationFailed('limit');
      return { notContinued: migrationLimit === 0 ? 'migration is disabled (--migration-limit 0)' : `the request already moved ${migrationLimit} times (--migration-limit)` };
    }
    try {
      const next = await open(delivered.continuation(gen), signal, tried);
      const toId = next.worker.record.worker_id;
      metrics.migrated(reason);
      log.info(
        { event: 'stream_migrated', request_id: gen.request_id, from_worker: fromId, to_worker: toId, tokens_delivered: delivered.tokens, reason },
        `request ${gen.request_id} moved from ${fromId} to ${toId} after ${delivered.tokens} tokens (${reason})`,
      );
      return next;
    } catch (e) {
      if (signal.aborted) throw e;
      metrics.migrationFailed(e instanceof EbbError && (e.code === 'no_serving_worker' || e.code === 'model_not_found') ? 'no_worker' : 'error');
      return { notContinued: (e as Error).message };
    }
  }

  /** Ends a stream that broke: an SSE error event when it had started, a JSON 500 when it never could. */
  function fail(res: ServerResponse, workerId: string, err: unknown, out: string, fmt: SseFormatter, notContinued?: string): void {
    try {
      if (!res.headersSent) {
        log.error({ event: 'response_failed', worker_id: workerId, err: (err as Error).message }, `could not start the response: ${(err as Error).message}`);
        res.writeHead(500, { 'content-type': 'application/json; charset=utf-8' });
        res.end(JSON.stringify(errorBody('internal_error', `could not start the response: ${(err as Error).message}`)));
        return;
      }
      const failure = new MidStreamFailure(workerId, err, notContinued);
      metrics.midStreamFailure();
      log.warn({ event: 'midstream_failure', worker_id: workerId, code: failure.code, err: failure.message }, failure.message);
      res.end(out + fmt.error(failure.code, failure.message));
    } catch {
      res.destroy();
    }
  }

  /**
   * Non-streaming: nothing reaches the client until the end, and a worker that fails half way is
   * replaced the same way as in a stream: the next one continues from what was generated.
   */
  async function collect(gen: GenerateBody, signal: AbortSignal): Promise<{ text: string; finishReason: string; usage: Usage }> {
    const tried = new Set<string>();
    const delivered = new Delivered();
    let up = await open(gen, signal, tried);
    try {
      for (;;) {
        try {
          for (let batch: StreamLine[] | undefined = up.first; batch; batch = (await up.rest.next()).value ?? undefined) {
            for (const line of batch) {
              if ('text' in line) delivered.add(line.text, line.token_ids);
              else if ('done' in line) return { text: delivered.text, finishReason: line.finish_reason, usage: delivered.usage(line.usage) };
              else throw endOf(up, line);
            }
          }
          throw new StreamCut();
        } catch (err) {
          if (signal.aborted) throw err;
          const next = await continueElsewhere(gen, delivered, up, err, tried, signal);
          if (!('worker' in next)) {
            const failure = new MidStreamFailure(up.worker.record.worker_id, err, next.notContinued);
            throw new EbbError(failure.code, failure.message);
          }
          up = next;
        }
      }
    } finally {
      up.release();
    }
  }

  return app;
}
