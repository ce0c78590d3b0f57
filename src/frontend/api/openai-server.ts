import cors from '@fastify/cors';
import { CAPABILITIES } from '../../protocol/capabilities.js';
import { EventIds, type StreamFormat } from '../wire/stream-format.js';
import type { StreamStore } from '../streams/stream-store.js';
import { addResumeRoutes, resumeStream } from '../streams/resume-routes.js';
import { assistantTurn, ResponseCancelled, ResponseRecords, type ResponseRecord } from '../streams/response-records.js';
import type { ChatMessage } from '../../protocol/request-plane.js';
import { detachedResponse } from '../streams/detached-response.js';
import { takeoverPoint, type TakeoverPlan } from '../streams/takeover.js';
import { toPeer } from '../cluster/peer-proxy.js';
import { EbbError } from '../../protocol/errors.js';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import type { AdminGuard } from '../../common/admin-auth.js';
import { allowOnly, createHttpServer, type HttpServerLimits } from '../../common/http-server.js';
import { FIELD_POLICY, RESPONSES_FIELD_POLICY, checkFields, type FieldPolicy } from './field-policy.js';
import type { FrontendMetrics } from '../metrics.js';
import { completionResponse, SseFormatter, toGenerateBodies, type Endpoint } from './openai-format.js';
import { chatCompletionSchema, completionSchema, responsesSchema, type OpenAIRequest } from './openai-schema.js';
import { createRelay, headerValue, type StreamReply } from '../relay/relay.js';
import { DEFAULT_MAX_LANES_PER_REQUEST, LaneBudget } from './lane-budget.js';
import { Shutdown } from '../shutdown.js';
import { probeHalfClosedClient } from './client-gone.js';
import { ResponseShell, ResponsesStream, responseObject, responsesToGenerate, type ResponseProgress, type ResponsesRequest, type ResponseStatus } from './responses-format.js';
import type { Upstream } from '../relay/upstream.js';
import { modelNotFound } from '../relay/worker-answer.js';
import { onServed, servedAs, type Served } from './served-model.js';
import { requestIdOf } from './request-id.js';
import { HERMES_SYNTAX, toolsActive } from '../../protocol/tools.js';
import { callIds, parseToolCalls } from '../wire/tool-call-parser.js';
import { finishWithCalls, ToolCallStream } from './tool-stream.js';
import { responseWithCalls, ResponsesToolStream } from './responses-tools.js';
import type { GenerateBody } from '../../protocol/request-plane.js';
import { addEmbeddingsRoute } from './embeddings-route.js';
import { tagEmbedTicket, tagTickets, type ServiceTier } from '../admission/ticket.js';
import type { WorkerPool } from '../routing/worker-pool.js';
import type { ClusterHooks } from '../frontend.js';

export interface OpenAIServerDeps {
  pool: WorkerPool;
  upstream: Upstream;
  metrics: FrontendMetrics;
  log: Logger;
  limits?: HttpServerLimits | undefined;
  /** How many times one request may move to another worker mid-stream (default 3; 0 disables). */
  migrationLimit?: number | undefined;
  /** A streaming client that reads nothing this long is disconnected (default 30 s; 0: never). */
  clientWriteTimeoutMs?: number | undefined;
  /** Origins browsers may call from (CORS); none by default. `*` allows any. */
  corsOrigins?: string[] | undefined;
  /** /health answers 200 even when no worker can take a request (default: 503 until one can). */
  healthReadyWithoutWorkers?: boolean | undefined;
  /** Sequences per request and file descriptors across requests (default: 128 per request, no fd bound). */
  lanes?: LaneBudget | undefined;
  /** Readiness on the way out, and what ends the requests still open at the shutdown deadline. */
  shutdown?: Shutdown | undefined;
  /** Client API keys (--api-key-file): every /v1/ route needs one. None: the public API is open. */
  apiGuard?: AdminGuard | undefined;
  /** One process of several serving this port: its slot goes in a header, /metrics is the whole frontend's, ids name it. */
  cluster?: Pick<ClusterHooks, 'slot' | 'scrape' | 'peerUrl'> | undefined;
  /** Where streams are kept for resumption (--stream-store); none: streams end with their connection, as before. */
  streams?: StreamStore | undefined;
  /** Requests no worker can take now wait (--queue-timeout); none: 503 at once, as before. */
  queueing?: boolean | undefined;
}

export const DEFAULT_MIGRATION_LIMIT = 3;

/**
 * A stream's last event when its frontend hands it on at its shutdown deadline: where to resume it
 * (another frontend of the fleet takes it over), and an SSE `retry:` for EventSource clients.
 */
function handOnEvent(endpoint: TakeoverPlan['endpoint'], id: string, last: number): string {
  const path = endpoint === 'responses' ? 'responses' : endpoint === 'chat' ? 'chat/completions' : 'completions';
  const body = {
    type: 'ebb.resume',
    response_id: id,
    last_event_id: last,
    resume_url: `/v1/${path}/${id}?stream=true&starting_after=${last}`,
    message: 'this frontend is shutting down: resume the stream (another frontend continues it)',
  };
  return `retry: 1000\nevent: ebb.resume\ndata: ${JSON.stringify(body)}\n\n`;
}

/** A 404 of this frontend's own records: another frontend of the fleet may hold the response. */
const notHere = (err: unknown) => err instanceof EbbError && err.code === 'response_not_found';

/** Hex digits of a --processes slot at the start of a response id (up to 4,096 processes). */
const SLOT_DIGITS = 3;

/** The capabilities a client can ask for (continuation is ebb's own business). */
const API_CAPABILITIES = CAPABILITIES.filter((c) => c !== 'continuation');

const uuid = () => randomUUID().replaceAll('-', ''); // randomUUID: pooled entropy, ~20x cheaper than randomBytes

/** The public OpenAI-compatible API. No admin route lives here. */
export function createOpenAIServer({
  pool,
  upstream,
  metrics,
  log,
  limits,
  migrationLimit = DEFAULT_MIGRATION_LIMIT,
  clientWriteTimeoutMs,
  corsOrigins = [],
  healthReadyWithoutWorkers = false,
  lanes = new LaneBudget(DEFAULT_MAX_LANES_PER_REQUEST, undefined),
  shutdown = new Shutdown(),
  apiGuard,
  cluster,
  streams,
  queueing = false,
}: OpenAIServerDeps): FastifyInstance {
  // The Responses API's state (retrieve, cancel, background, previous_response_id) lives beside the kept streams.
  const records = streams === undefined ? undefined : new ResponseRecords(streams.opts.responseTtlMs, streams.opts.maxStreams, streams.mirror);
  const app = createHttpServer({ role: 'public', ...limits });
  // On the raw response: streams write their head themselves, and writeHead keeps what setHeader set.
  // A callback hook: an async one costs every request a promise for synchronous work.
  const slot = cluster === undefined ? undefined : String(cluster.slot);
  app.addHook('onRequest', (req, reply, done) => {
    reply.raw.setHeader('x-request-id', requestIdOf(req.headers['x-request-id']));
    if (slot !== undefined) reply.raw.setHeader('x-ebb-frontend-process', slot);
    done();
  });
  lanes.watch(app.server);
  if (apiGuard !== undefined) {
    // /live, /health and /metrics stay open: probes and scrapers carry no key; CORS preflights neither.
    app.addHook('onRequest', async (req) => {
      if (req.url.startsWith('/v1/') && req.method !== 'OPTIONS') apiGuard(req.headers.authorization);
    });
  }
  const relay = createRelay({ pool, upstream, metrics, log, migrationLimit, clientWriteTimeoutMs });
  if (corsOrigins.length > 0) {
    // Registered before the routes so the preflight (OPTIONS) is answered for each of them.
    void app.register(cors, { origin: corsOrigins.includes('*') ? true : corsOrigins, methods: ['GET', 'POST'], maxAge: 600, exposedHeaders: ['x-request-id', 'x-ebb-worker-id'] });
  }
  // A callback hook: an async one costs every request a promise for synchronous work.
  app.addHook('onResponse', (req, reply, done) => {
    const url = req.routeOptions.url;
    if (url === '/v1/chat/completions' || url === '/v1/completions' || url === '/v1/responses' || url === '/v1/embeddings') {
      const model = (req.body as { model?: unknown } | undefined)?.model;
      metrics.request(url, reply.statusCode, typeof model === 'string' ? model : undefined);
    }
    done();
  });

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
  const methods = (url: string, allowed: Array<'GET' | 'POST'>) => allowOnly(app, url, corsOrigins.length > 0 ? [...allowed, 'OPTIONS'] : allowed);

  methods('/v1/models', ['GET']);
  // LoRA adapters as vLLM lists them: each its own model, `parent` its base model.
  const adapterModel = (a: { name: string; base: string; available: boolean }) => ({ ...model(a.base), id: a.name, root: a.name, parent: a.base, status: a.available ? 'available' : 'unavailable' });
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
  const scrape = cluster?.scrape ?? (() => metrics.registry.metrics());
  app.get('/metrics', async (_req, reply) => reply.header('content-type', metrics.registry.contentType).send(await scrape()));

  /**
   * What every generating route checks first: a model somebody serves (or an adapter some worker can
   * load), and fields the fleet can honour. With a queue, a known model with no worker in discovery
   * goes on to wait for one (its fields are then the worker's to check).
   */
  const admit = (body: { model: string }, table: FieldPolicy): Served => {
    const served = servedAs(pool, body.model, queueing);
    if (pool.hasModel(served.model)) checkFields((served.adapter === undefined ? body : { ...body, model: served.model }) as unknown as Record<string, unknown>, table, pool);
    return served;
  };
  /**
   * The queue's ticket on each generate body (none without a queue: nothing per request then), and
   * the service_tier its answer says: the tier it was admitted in; without a queue there are no tiers, so default.
   * `client`: the request's signal, so a queued request whose client left leaves the queue at once (none: a background response).
   */
  const ticket = (gens: readonly GenerateBody[], tier: unknown, req: FastifyRequest, client: AbortSignal | undefined): ServiceTier => (queueing ? tagTickets(gens, tier, req.headers, apiGuard, client) : 'default');

  /** Room for a request's sequences, held until its response is done, however it ends (a kept stream: until its generation is). */
  const holdLanes = (reply: FastifyReply, model: string, count: number, n: number) => {
    const release = lanes.take(count, pool.servingPath(model) === 'disaggregated' ? 2 : 1, { prompts: count / n, n });
    let until: Promise<void> | undefined;
    reply.raw.once('close', () => (until === undefined ? release() : void until.then(release)));
    return { keepUntil: (over: Promise<void>) => void (until = over) };
  };

  // With --processes N an id starts with its process's slot: a resume, retrieve or next turn that
  // reaches another process is passed to the one that holds it.
  const idSlot = cluster === undefined ? '' : cluster.slot.toString(16).padStart(SLOT_DIGITS, '0');
  const newId = () => (cluster === undefined ? uuid() : idSlot + uuid().slice(SLOT_DIGITS));
  const elsewhere = (id: string): string | undefined => {
    if (cluster?.peerUrl === undefined) return undefined;
    const owner = Number.parseInt(id.replace(/^(chatcmpl-|cmpl-|resp_)/, '').slice(0, SLOT_DIGITS), 16);
    return Number.isInteger(owner) && owner !== cluster.slot ? cluster.peerUrl(owner) : undefined;
  };
  /** The request, passed to the process that holds `id` when another one does (undefined: served here). */
  const toHolder = (id: string, req: FastifyRequest, reply: FastifyReply, body?: unknown): Promise<void> | undefined => {
    const holder = elsewhere(id);
    if (holder === undefined) return undefined;
    reply.hijack();
    return toPeer(holder, req.method, req.url, req.headers, body, reply.raw);
  };
  if (streams !== undefined) addResumeRoutes(app, { store: streams, methods, toHolder });
  /** previous_response_id: this frontend's own record, else (a fleet) the shared store's events and plan. */
  const previousTurns = async (id: string): Promise<ChatMessage[]> => {
    const mirror = records!.find(id) === undefined ? streams?.mirror : undefined;
    if (mirror !== undefined) {
      // Stored by another frontend of the fleet: its conversation, kept in the shared store (or, a
      // streamed one whose store write is still on its way, its plan's input and its events' answer).
      const kept = await mirror.keptResponse(id);
      if (kept !== undefined) return kept.history;
      const shared = await mirror.response(id);
      const plan = shared?.plan?.responses;
      if (shared?.done === true && plan !== undefined) {
        const messages = shared.plan!.gens[0]!.messages ?? [];
        return [...(plan.request.instructions ? messages.slice(1) : messages), assistantTurn(shared.object.output as Parameters<typeof assistantTurn>[0])];
      }
    }
    // This frontend's own, or the 400 saying why there is none.
    return records!.history(id);
  };

  if (streams?.mirror !== undefined) {
    const store = streams;
    // A cancel asked at another frontend, for a background response this one runs.
    store.mirror!.cancelled = (id) => {
      const r = records?.find(id);
      if (r?.background === true && r.final === undefined) r.kept?.cancel(new ResponseCancelled(id));
    };
    // A stream whose frontend died, continued here from what the shared store kept: the same ids, the same format, its sequence continued on a worker.
    store.mirror!.takeover = async (id, plan, events) => {
      const point = await takeoverPoint(plan, events);
      if (point === undefined) return false;
      const kept = store.adopt(id, events);
      const made = plan.responses;
      const shell = made === undefined ? undefined : new ResponseShell(made.uuid, made.request, made);
      if (shell !== undefined && plan.serviceTier !== undefined) shell.serviceTier = plan.serviceTier;
      const fmt =
        plan.endpoint === 'responses' && shell !== undefined
          ? new ResponsesStream(shell, true, { seq: point.lastId + 1, text: point.resumed[0]!.text })
          : new SseFormatter(plan.endpoint === 'completion' ? 'completion' : 'chat', id, plan.model, 1, plan.includeUsage, false, new EventIds(point.lastId + 1), plan.created, plan.serviceTier);
      const detached = { raw: detachedResponse(), hijack: () => undefined };
      void relay
        .stream(detached, fmt, plan.gens, 1, kept.signal, performance.now(), kept, point.resumed)
        .catch((err: unknown) => log.warn({ event: 'takeover_failed', response_id: id, err: (err as Error).message }, `continuing ${id} failed: ${(err as Error).message}`))
        .finally(() => kept.stopped());
      return true;
    };
  }

  /**
   * Streams a response. With a stream store it is kept: each event numbered, its generation
   * outliving its client by the store's grace (a resume picks it up), a cut at shutdown written to
   * it too; a request that failed before its first byte is not kept.
   */
  const streamOut = async (
    reply: StreamReply,
    id: string,
    fmtFor: (kept: boolean) => StreamFormat,
    gens: GenerateBody[],
    n: number,
    signal: AbortSignal,
    started: number,
    room: ReturnType<typeof holdLanes>,
    responses: { background?: boolean; record?: ResponseRecord | undefined; plan?: TakeoverPlan | undefined } = {},
  ) => {
    const kept = streams?.open(id);
    // With a shared store, how another frontend would go on with it if this one went away.
    if (kept !== undefined && responses.plan !== undefined) streams!.mirror?.plan(id, responses.plan);
    const fmt = fmtFor(kept !== undefined);
    const record = responses.record;
    if (kept === undefined) {
      try {
        await relay.stream(reply, fmt, gens, n, signal, started);
      } finally {
        if (record !== undefined) settleStreamed(record, fmt, signal);
      }
      Shutdown.endCutStream(reply.raw, fmt, signal);
      return;
    }
    room.keepUntil(kept.over);
    if (record !== undefined) record.kept = kept;
    if (responses.background === true) kept.detach();
    else kept.watch(signal);
    try {
      await relay.stream(reply, fmt, gens, n, kept.signal, started, kept);
      // Ended by a cut (shutdown) or a cancel: followers and the client still there get why, as the last event.
      const reason = kept.signal.reason as unknown;
      const cut = Shutdown.cutReason(kept.signal);
      // Past this frontend's shutdown deadline, with a peer to take it over: handed on, not cut.
      const last = cut?.code === 'server_closing' && responses.plan !== undefined ? kept.handOn() : undefined;
      if (last !== undefined) {
        if (reply.raw.headersSent && !reply.raw.writableEnded) reply.raw.end(handOnEvent(responses.plan!.endpoint, id, last));
        return;
      }
      const why = cut !== undefined ? fmt.error(cut.code, cut.message) : reason instanceof ResponseCancelled ? fmt.error('cancelled', reason.message) : undefined;
      if (why !== undefined) {
        kept.end(Buffer.from(why));
        if (reply.raw.headersSent && !reply.raw.writableEnded) reply.raw.end(why);
      }
    } catch (err) {
      throw Shutdown.cutReason(kept.signal) ?? err;
    } finally {
      if (kept.keptBytes === 0 && kept.state === 'live') streams!.discard(kept);
      kept.stopped();
      if (record !== undefined) settleStreamed(record, fmt, kept.signal);
    }
  };

  /** A streamed response is over: its record takes the final object (or says it was cancelled, or failed). */
  const settleStreamed = (record: ResponseRecord, fmt: StreamFormat, signal: AbortSignal) => {
    if (records === undefined || record.final !== undefined) return;
    const now = (fmt as unknown as ResponseProgress).now() as Record<string, unknown>;
    const status: ResponseStatus = signal.reason instanceof ResponseCancelled ? 'cancelled' : now.status === 'in_progress' ? 'failed' : (now.status as ResponseStatus);
    void records.settle(record, now, status);
  };


  /** How a tool request's answers are parsed: the model's call syntax, and call ids from the request's content. */
  const toolParsing = (gen: GenerateBody) => {
    const syntax = pool.toolSyntax(gen.model) ?? HERMES_SYNTAX;
    const key = JSON.stringify([gen.model, gen.messages, gen.tools, gen.tool_choice, gen.seed ?? null]);
    return { syntax, idsFor: (lane: number) => callIds(key, lane) };
  };

  const route = (endpoint: Endpoint, url: string, schema: object) => {
    methods(url, ['POST']);
    app.post<{ Body: OpenAIRequest }>(url, { schema: { body: schema } }, async (req, reply) => {
      const body = req.body;
      const served = admit(body, FIELD_POLICY);
      const id = `${endpoint === 'chat' ? 'chatcmpl' : 'cmpl'}-${newId()}`;
      const gens = onServed(toGenerateBodies(endpoint, body, id), served);
      const n = body.n ?? 1;
      const room = holdLanes(reply, served.model, gens.length, n);
      const signal = shutdown.requestSignal(reply.raw);
      const tier = ticket(gens, body.service_tier, req, signal);
      probeHalfClosedClient(req, reply);
      const started = performance.now();
      // With tools: the answers' raw text is parsed into calls, in the syntax the model's workers declare.
      const tools = endpoint === 'chat' && toolsActive(gens[0]!.tools, gens[0]!.tool_choice) ? toolParsing(gens[0]!) : undefined;
      try {
        if (body.stream) {
          const created = Math.floor(Date.now() / 1000);
          const includeUsage = body.stream_options?.include_usage === true;
          const fmtFor = (kept: boolean) => {
            const sse = new SseFormatter(endpoint, id, body.model, gens.length, includeUsage, gens[0]!.logprobs === true, kept ? new EventIds() : undefined, created, tier);
            return tools === undefined ? sse : new ToolCallStream(sse, tools.syntax, tools.idsFor, gens.length);
          };
          // One plain sequence can be continued by another frontend from its events alone.
          const plan: TakeoverPlan | undefined = gens.length === 1 && tools === undefined && gens[0]!.logprobs !== true ? { endpoint, gens, model: body.model, includeUsage, created, serviceTier: tier } : undefined;
          return await streamOut(reply, id, fmtFor, gens, n, signal, started, room, { plan });
        }
        const { choices, usage, workerId } = await relay.collect(gens, n, signal);
        void reply.header('x-ebb-worker-id', headerValue(workerId));
        if (tools !== undefined)
          for (const [lane, c] of choices.entries()) {
            c.tools = parseToolCalls(c.text, tools.syntax, tools.idsFor(lane));
            c.finishReason = finishWithCalls(c.finishReason, c.tools.calls.length);
          }
        return completionResponse(endpoint, id, body.model, choices, usage, tier);
      } catch (err) {
        throw Shutdown.cutReason(signal) ?? err;
      }
    });
  };
  route('chat', '/v1/chat/completions', chatCompletionSchema);
  route('completion', '/v1/completions', completionSchema);

  methods('/v1/responses', ['POST']);
  app.post<{ Body: ResponsesRequest }>('/v1/responses', { schema: { body: responsesSchema } }, async (req, reply) => {
    const body = req.body;
    const served = admit(body, RESPONSES_FIELD_POLICY);
    // The next turn of a response another process holds is served there, where its history is.
    const passed = typeof body.previous_response_id === 'string' ? toHolder(body.previous_response_id, req, reply, body) : undefined;
    if (passed !== undefined) return passed;
    const stateful = body.background === true ? 'background' : typeof body.previous_response_id === 'string' ? 'previous_response_id' : undefined;
    if (stateful !== undefined && records === undefined) throw new EbbError('unsupported_parameter', `${stateful} needs kept responses: this server keeps none (a frontend run with --stream-store none, or a worker's --openai-port)`, { param: stateful });
    if (body.background === true && body.store === false) throw new EbbError('invalid_request', 'background responses are stored: store false is not allowed with background true', { param: 'store' });
    const previous = typeof body.previous_response_id === 'string' ? await previousTurns(body.previous_response_id) : [];
    const room = holdLanes(reply, served.model, 1, 1);
    const shell = new ResponseShell(newId(), body);
    const { gen, history } = responsesToGenerate(body, shell.id, previous);
    onServed([gen], served);
    const signal = shutdown.requestSignal(reply.raw);
    shell.serviceTier = ticket([gen], body.service_tier, req, body.background === true ? undefined : signal);
    const tools = toolsActive(gen.tools, gen.tool_choice) ? toolParsing(gen) : undefined;
    const record: ResponseRecord | undefined = records === undefined ? undefined : { id: shell.id, background: body.background === true, store: body.store !== false, history, status: 'in_progress', endedAt: 0 };
    if (record !== undefined) records!.add(record);
    const fmtFor = (kept: boolean) => {
      const fmt = tools === undefined ? new ResponsesStream(shell, kept) : new ResponsesToolStream(shell, tools.syntax, tools.idsFor(0), kept);
      if (record !== undefined) record.progress = fmt;
      return fmt;
    };
    // How another frontend continues it (or answers for it) from the shared store.
    const plan: TakeoverPlan | undefined =
      tools === undefined ? { endpoint: 'responses', gens: [gen], model: body.model, includeUsage: false, created: shell.createdAt, serviceTier: shell.serviceTier, responses: { uuid: shell.id.slice('resp_'.length), request: body, messageId: shell.messageId, createdAt: shell.createdAt } } : undefined;
    if (body.background === true) {
      // Runs with no client: its events are kept (GET ?stream=true follows them), its object retrievable, cancel stops it.
      const detached = { raw: detachedResponse(), hijack: () => undefined };
      void streamOut(detached, shell.id, fmtFor, [gen], 1, new AbortController().signal, performance.now(), room, { background: true, record, plan }).catch((err: unknown) =>
        log.warn({ event: 'background_response_failed', response_id: shell.id, err: (err as Error).message }, `background response ${shell.id} failed: ${(err as Error).message}`),
      );
      // In a fleet, announced once the shared store has it: the client may ask another frontend next.
      await streams?.mirror?.applied();
      return shell.object('queued', undefined, undefined);
    }
    probeHalfClosedClient(req, reply);
    try {
      if (body.stream) return await streamOut(reply, shell.id, fmtFor, [gen], 1, signal, performance.now(), room, { record, plan });
      const { choices, usage, workerId } = await relay.collect([gen], 1, signal);
      void reply.header('x-ebb-worker-id', headerValue(workerId));
      const answer = tools !== undefined ? responseWithCalls(shell, choices[0]!, usage, parseToolCalls(choices[0]!.text, tools.syntax, tools.idsFor(0))) : responseObject(shell, choices[0]!, usage);
      // Stored before it is answered: the client's next call, at any frontend, finds it.
      if (record !== undefined) await records!.settle(record, answer, answer.status);
      return answer;
    } catch (err) {
      if (record !== undefined && record.final === undefined) void records!.settle(record, shell.object('failed', undefined, undefined), 'failed');
      throw Shutdown.cutReason(signal) ?? err;
    }
  });

  if (records !== undefined && streams !== undefined) {
    // The Responses API's own GET: the object (status, output so far), or with stream=true its events after starting_after.
    methods('/v1/responses/:id', ['GET']);
    app.get<{ Params: { id: string }; Querystring: { stream?: string; starting_after?: string } }>('/v1/responses/:id', async (req, reply) => {
      const passed = toHolder(req.params.id, req, reply);
      if (passed !== undefined) return passed;
      if (req.query.stream === 'true') return resumeStream(streams, req.params.id, req.query.starting_after, req.headers['last-event-id'], reply.raw, () => reply.hijack());
      try {
        return records.object(records.get(req.params.id));
      } catch (err) {
        // Another frontend of the fleet runs (or ran) it: its object, read from the shared store.
        const mirror = notHere(err) ? streams.mirror : undefined;
        const shared = (await mirror?.keptResponse(req.params.id))?.object ?? (await mirror?.response(req.params.id))?.object;
        if (shared === undefined) throw err;
        return shared;
      }
    });
    // Stops a background response's generation on its worker at once; the object says `cancelled`.
    methods('/v1/responses/:id/cancel', ['POST']);
    app.post<{ Params: { id: string } }>('/v1/responses/:id/cancel', async (req, reply) => {
      const passed = toHolder(req.params.id, req, reply, req.body ?? {});
      if (passed !== undefined) return passed;
      let record: ResponseRecord;
      try {
        record = records.get(req.params.id);
      } catch (err) {
        const shared = notHere(err) ? await streams.mirror?.response(req.params.id) : undefined;
        if (shared === undefined) throw err;
        if (shared.plan?.responses?.request.background !== true) throw new EbbError('invalid_request', `only background responses can be cancelled; ${req.params.id} is not one`, { param: 'response_id' });
        // The frontend that runs it stops it at once (told through the store); the object says how it ended.
        if (!shared.done) await streams.mirror!.cancel(req.params.id);
        return (await streams.mirror!.response(req.params.id))?.object ?? shared.object;
      }
      if (!record.background) throw new EbbError('invalid_request', `only background responses can be cancelled; ${record.id} is not one`, { param: 'response_id' });
      if (record.final === undefined && record.kept !== undefined) {
        record.kept.cancel(new ResponseCancelled(record.id));
        await record.kept.over;
      }
      return records.object(record);
    });
  }

  methods('/v1/embeddings', ['POST']);
  addEmbeddingsRoute(app, { pool, upstream, shutdown, admit, holdLane: (reply, model) => void holdLanes(reply, model, 1, 1), ticket: (body, req) => {
      if (queueing) tagEmbedTicket(body, req.headers, apiGuard);
    },
  });

  return app;
}
