import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import type { AdminGuard } from '../common/admin-auth.js';
import { allowOnly, createHttpServer } from '../common/http-server.js';
import { writeWithBackpressure } from '../common/backpressure.js';
import type { WorkerMode } from '../protocol/worker-mode.js';
import type { Engine, GenerateRequest, GenerateResult } from '../engine/engine.js';
import type { Admission, RefusalCode } from '../lifecycle/admission.js';
import { capabilitiesNeeded, missingCapability } from '../protocol/capabilities.js';
import { EbbError, errorBody, type ErrorCode } from '../protocol/errors.js';
import { GenerateBodySchema, promptOf, type GenerateBody, type KvTransferRef, type PrefillResponse, type StreamLine, type TokenizeResponse, type Usage } from '../protocol/request-plane.js';
import { KvPullError } from './kv-pull-error.js';
import { KV_STATE_HEADER, KvStatePullError, type KvPullOutcome } from './kv-state-wire.js';
import { createReadStream } from 'node:fs';
import type { WorkerMetrics } from './metrics.js';
import type { PrefillPeers } from './prefill-peers.js';
import { HandOff, RequestScope, ShutdownCut } from './request-scope.js';
import { estimateDrainMs, TokenPace } from './drain-eta.js';

export interface RequestPlaneDeps {
  model: string;
  workerId: string;
  mode: WorkerMode;
  engine: Engine;
  admission: Admission;
  metrics: WorkerMetrics;
  log: Logger;
  /** This request plane's own URL, the source decode peers pull KV from. */
  selfUrl: () => string;
  /** Decode workers: the prefill workers whose KV they may pull. */
  prefillPeers?: PrefillPeers | undefined;
  /** Checks the request-plane token on every route, when one is configured. */
  guard?: AdminGuard | undefined;
  /** Sent to prefill peers when pulling KV. */
  requestToken?: string | undefined;
  /** Counts each pull of a real KV state by how it ended. */
  onKvPull?: ((outcome: KvPullOutcome) => void) | undefined;
}

export interface RequestPlane {
  app: FastifyInstance;
  /** Admitted requests whose scope is open. */
  readonly open: number;
  /** Shutdown deadline: ends every open request with a terminal `worker_shut_down` line; resolves once all are closed. */
  cutAll(signal: AbortSignal): Promise<void>;
  /**
   * Drain deadline: ends every open generation with a terminal hand-off line, for the caller to
   * continue elsewhere. Returns how many were handed off; `closed` settles once they are released.
   */
  handOffAll(): { count: number; closed: Promise<void> };
  /** Estimated ms until every admitted request is done (see drain-eta); null when unknown. */
  drainEta(): number | null;
}

function usageOf(r: GenerateResult): Usage {
  const usage: Usage = { prompt_tokens: r.prompt_tokens, completion_tokens: r.completion_tokens, total_tokens: r.prompt_tokens + r.completion_tokens };
  // Only where the engine can tell: an engine without a prefix cache says nothing, not 0.
  if (r.cached_tokens !== undefined) usage.prompt_tokens_details = { cached_tokens: r.cached_tokens };
  return usage;
}

const line = (l: StreamLine) => JSON.stringify(l) + '\n';

/** POST /tokenize calls in progress at once, their bodies included; past it 503 worker_overloaded. */
export const MAX_TOKENIZING = 8;

/** The worker's request plane: POST /generate, admission-checked before any work is done. */
export function createRequestPlane(deps: RequestPlaneDeps): RequestPlane {
  const { model, workerId, mode, engine, admission, metrics, log, selfUrl, prefillPeers, guard, requestToken, onKvPull } = deps;
  const app = createHttpServer({ role: 'internal' });
  const scopes = new Set<RequestScope>();
  /** Scopes of /generate: what a hand-off can move (a prefill is short and finishes where it runs). */
  const generating = new Set<RequestScope>();
  const closeWaiters = new Set<() => void>();
  const pace = new TokenPace();
  const onClose = (s: RequestScope) => {
    scopes.delete(s);
    generating.delete(s);
    for (const w of closeWaiters) w();
  };
  /** Resolves once none of `these` is open any more, or `signal` aborts. */
  function whenClosed(these: RequestScope[], signal?: AbortSignal): Promise<void> {
    return new Promise<void>((resolve) => {
      const check = () => {
        if (these.every((s) => !scopes.has(s))) {
          closeWaiters.delete(check);
          resolve();
        }
      };
      closeWaiters.add(check);
      signal?.addEventListener('abort', () => {
        closeWaiters.delete(check);
        resolve();
      }, { once: true });
      check();
    });
  }

  if (guard) app.addHook('onRequest', async (req) => guard(req.headers.authorization));

  /** Validation shared by /generate and /prefill, then the one admission point. */
  function admit(body: GenerateBody, res: RequestScope['res']): { gen: GenerateRequest; scope: RequestScope } | { refused: RefusalCode } {
    if (body.model !== model) throw new EbbError('model_not_found', `this worker serves "${model}", not "${body.model}"`);
    const prompt = promptOf(body);
    if (prompt === undefined) throw new EbbError('invalid_request', 'one of prompt, messages or prompt_token_ids is required');
    if (body.kv_transfer !== undefined) checkKvSource(body.kv_transfer);
    if (body.handoff_kv !== undefined) checkHandoffSource(body);
    const lacking = missingCapability(engine.capabilities, capabilitiesNeeded(body));
    if (lacking === 'continuation')
      throw new EbbError('continuation_unsupported', `this worker's engine (${engine.kind}) cannot continue a sequence another worker started`);
    // The frontend routes only to workers that declare it; a direct caller gets the same answer.
    if (lacking !== undefined) throw new EbbError('unsupported_parameter', `this worker's engine (${engine.kind}) cannot honour response_format ${lacking}`, { param: 'response_format' });
    const requestId = body.request_id ?? randomUUID();
    const admitted = admission.admit(requestId);
    if (!admitted.admitted) {
      metrics.refused(admitted.code);
      return { refused: admitted.code };
    }
    const scope = new RequestScope(admitted.ticket, res, onClose);
    // What the drain ETA counts down from: the budget, or the context left where the engine has one
    // (an upper bound: the prompt's share of it is the engine's to count).
    const maxContext = engine.capabilities.max_context;
    scope.budget = body.max_tokens ?? (maxContext === null ? undefined : Math.max(0, maxContext - (body.continuation?.completion_tokens ?? 0)));
    scope.admittedToFreeSlot = scopes.size < engine.stats().batch_slots;
    scopes.add(scope);
    const gen: GenerateRequest = {
      request_id: requestId,
      prompt,
      messages: body.messages,
      prompt_token_ids: body.prompt_token_ids,
      // Absent: until the model stops or its context is full (the engine knows its context).
      max_tokens: body.max_tokens,
      temperature: body.temperature ?? 1,
      top_p: body.top_p,
      seed: body.seed,
      stop: typeof body.stop === 'string' ? [body.stop] : body.stop,
      prefilled: body.kv_transfer !== undefined,
      continuation: body.continuation,
      response_format: body.response_format?.type === 'text' ? undefined : body.response_format,
    };
    return { gen, scope };
  }

  /** Only decode workers pull KV, and only from a prefill worker registered in their discovery view. */
  function checkKvSource(ref: KvTransferRef): void {
    if (mode !== 'decode') throw new EbbError('invalid_request', `kv_transfer is only accepted by decode workers; this worker is ${mode}`);
    if (!prefillPeers?.trusts(ref))
      throw new EbbError('forbidden', `kv_transfer source is not a registered prefill worker (worker_id "${ref.worker_id}" at that URL)`);
  }

  /** A hand-off's state comes with its continuation. */
  function checkHandoffSource(body: GenerateBody): void {
    if (body.continuation === undefined) throw new EbbError('invalid_request', 'handoff_kv is only accepted with a continuation', { param: 'handoff_kv' });
  }

  /**
   * A hand-off's state is pulled, or freed at its source, only when that source is a worker this one
   * has seen registered: a request body must not make a worker call an arbitrary URL. A source it
   * has not seen (one that left discovery before this worker started, say) is no reason to refuse
   * the stream: it continues by re-evaluation, as after a crash.
   */
  function trustedHandoff(ref: KvTransferRef | undefined): KvTransferRef | undefined {
    if (ref === undefined || prefillPeers?.trusts(ref, 'any')) return ref;
    log.warn({ event: 'handoff_kv_untrusted', worker_id: ref.worker_id, source_url: ref.source_url }, `hand-off state from ${ref.worker_id} not used: no worker registered by that id at that URL in this worker's view; re-evaluating`);
    return undefined;
  }

  function refusal(code: RefusalCode) {
    const why = code === 'worker_draining' ? 'worker is draining; retry on another worker' : 'worker is overloaded; retry shortly or elsewhere';
    return errorBody(code, why);
  }

  allowOnly(app, '/generate', ['POST']);
  app.post<{ Body: GenerateBody }>('/generate', { schema: { body: GenerateBodySchema } }, async (req, reply) => {
    const admitted = admit(req.body, reply.raw);
    if ('refused' in admitted) return reply.code(503).header('retry-after', '1').send(refusal(admitted.refused));
    reply.hijack();
    generating.add(admitted.scope);
    await serve(admitted.scope, admitted.gen, req.body.stream !== false, req.body.kv_transfer, trustedHandoff(req.body.handoff_kv));
  });

  // Tokenizing admits no generation, but is admitted like one: refused once admission is closed
  // (draining, drained: the router then routes by load alone) and bounded in concurrency, checked
  // before the body is read (20 calls of 3.5 MB at once took a worker from 173 to 471 MB).
  let tokenizing = 0;
  allowOnly(app, '/tokenize', ['POST']);
  const admitTokenize = async (_req: FastifyRequest, reply: FastifyReply) => {
    const refused: RefusalCode | undefined = !admission.open ? 'worker_draining' : tokenizing >= MAX_TOKENIZING ? 'worker_overloaded' : undefined;
    if (refused !== undefined) return reply.code(503).header('retry-after', '1').send(refusal(refused));
    tokenizing++;
    reply.raw.once('close', () => tokenizing--);
  };
  app.post<{ Body: GenerateBody }>('/tokenize', { schema: { body: GenerateBodySchema }, onRequest: admitTokenize }, async (req, reply): Promise<TokenizeResponse> => {
    const body = req.body;
    if (body.model !== model) throw new EbbError('model_not_found', `this worker serves "${model}", not "${body.model}"`);
    if (!engine.tokenize) throw new EbbError('not_found', `this worker's engine (${engine.kind}) cannot tokenize prompts`);
    const prompt = promptOf(body);
    if (prompt === undefined) throw new EbbError('invalid_request', 'one of prompt, messages or prompt_token_ids is required');
    const gone = new AbortController();
    // The response closing before it was sent: the caller left.
    reply.raw.once('close', () => gone.abort());
    const ids = await engine.tokenize({ prompt, messages: body.messages, prompt_token_ids: body.prompt_token_ids, continuation: body.continuation }, gone.signal);
    return { token_ids: ids };
  });

  if (engine.prefill && engine.kvTransfers && (mode === 'prefill' || !engine.kvPayload)) {
    const prefill = engine.prefill.bind(engine);
    const transfers = engine.kvTransfers;
    allowOnly(app, '/prefill', ['POST']);
    app.post<{ Body: GenerateBody }>('/prefill', { schema: { body: GenerateBodySchema } }, async (req, reply) => {
      const admitted = admit(req.body, reply.raw);
      if ('refused' in admitted) return reply.code(503).header('retry-after', '1').send(refusal(admitted.refused));
      const { gen, scope } = admitted;
      reply.hijack();
      try {
        const t = await prefill(gen, scope.signal);
        const body: PrefillResponse = { transfer_id: t.transfer_id, source_url: selfUrl(), worker_id: workerId, prompt_tokens: t.prompt_tokens, kv_bytes: t.kv_bytes };
        // The caller left while the KV was computed: nobody will pull it.
        if (scope.dropped) transfers.complete(t.transfer_id);
        else {
          reply.raw.writeHead(200, { 'content-type': 'application/json' });
          scope.end(JSON.stringify(body), 'completed');
        }
      } catch (err) {
        failed(scope, err);
      }
    });
  }

  if (engine.kvTransfers) {
    const transfers = engine.kvTransfers;
    // Transfers are served while draining too: the KV was computed for requests already admitted
    // (a prefill's, or a stream's handed off at the drain deadline).
    allowOnly(app, '/kv/:id', ['GET', 'DELETE']);
    app.get<{ Params: { id: string } }>('/kv/:id', async (req, reply) => {
      const t = transfers.get(req.params.id);
      if (!t) throw new EbbError('kv_transfer_not_found', `no pending KV transfer ${req.params.id} (completed or expired)`);
      if (!engine.kvPayload) return reply.header('content-type', 'application/octet-stream').send(Buffer.alloc(t.kv_bytes, 0x6b));
      const payload = engine.kvPayload(req.params.id);
      if (!payload) throw new EbbError('kv_transfer_not_found', `no pending KV transfer ${req.params.id} (completed or expired)`);
      return reply
        .header('content-type', 'application/octet-stream')
        .header('content-length', payload.bytes)
        .header(KV_STATE_HEADER, payload.header)
        .send(createReadStream(payload.path));
    });
    app.delete<{ Params: { id: string } }>('/kv/:id', async (req, reply) => {
      if (!transfers.complete(req.params.id)) throw new EbbError('kv_transfer_not_found', `no pending KV transfer ${req.params.id}`);
      return reply.code(204).send();
    });
  }

  /** The scope owns the request from admission: every way out below ends in scope.end or scope.close. */
  async function serve(scope: RequestScope, gen: GenerateRequest, stream: boolean, kv: KvTransferRef | undefined, handoffKv?: KvTransferRef): Promise<void> {
    const res = scope.res;
    // An engine that exports its sequences: a stream handed off at the drain deadline leaves its KV
    // for the next worker. Not a non-streamed answer: its hand-off is a retry from scratch, and a
    // state nobody pulls would hold this worker's drain until its TTL.
    if (engine.kvPayload && stream)
      gen.kv_handoff = {
        wanted: (reason) => reason instanceof HandOff,
        exported: (t) => (scope.handoffKv = { transfer_id: t.transfer_id, source_url: selfUrl(), worker_id: workerId }),
      };
    try {
      // A request the engine refuses (a continuation its grammar does not allow) is a 400, not a stream.
      await engine.check?.(gen);
      // Admitted and alive reaches the caller before any KV pull: a transfer slower than the
      // frontend's headers timeout must not make this worker look hung (a 503 after seconds, for a
      // request the worker completes).
      if (stream) {
        res.writeHead(200, { 'content-type': 'application/x-ndjson', 'cache-control': 'no-cache', 'x-request-id': scope.id });
        res.flushHeaders();
      }
      if (kv && engine.importKv) {
        if (handoffKv) releaseLater(handoffKv);
        gen.kv_state = await takeKvState(scope, kv);
      } else if (kv) {
        // Loaded on the first pull: only a mocker decode worker pulls this way, and the module brings undici.
        const { pullKv } = await import('./kv-pull.js');
        const bytes = await pullKv(kv, scope.signal, requestToken);
        log.debug({ event: 'kv_pulled', request_id: scope.id, transfer_id: kv.transfer_id, kv_bytes: bytes }, 'KV pulled from prefill worker');
      } else if (handoffKv && engine.importKv) gen.kv_state = await takeKvState(scope, handoffKv);
      // An engine that cannot load it re-evaluates; the source must not wait for it until its TTL.
      else if (handoffKv) releaseLater(handoffKv);
      const tokens = scope.attach(engine.generate(gen, scope.signal));
      if (stream) {
        let step = await tokens.next();
        while (!step.done) {
          const piece = step.value;
          scope.piece(piece.token_ids?.length ?? 1, pace);
          await writeWithBackpressure(res, line(piece.token_ids ? { text: piece.text, token_ids: piece.token_ids } : { text: piece.text }), scope.signal);
          step = await tokens.next();
        }
        metrics.promptTokens(step.value.prompt_tokens, step.value.cached_tokens);
        scope.end(line({ done: true, finish_reason: step.value.finish_reason, usage: usageOf(step.value) }), 'completed');
      } else {
        let text = '';
        let step = await tokens.next();
        while (!step.done) {
          text += step.value.text;
          scope.piece(step.value.token_ids?.length ?? 1, pace);
          step = await tokens.next();
        }
        metrics.promptTokens(step.value.prompt_tokens, step.value.cached_tokens);
        const payload = JSON.stringify({ text, finish_reason: step.value.finish_reason, usage: usageOf(step.value) });
        res.writeHead(200, { 'content-type': 'application/json', 'x-request-id': scope.id });
        scope.end(payload, 'completed');
      }
    } catch (err) {
      // The engine exports a handed-off sequence as its generator ends: before the hand-off line names it.
      if (scope.signal.reason instanceof HandOff) await scope.settle();
      failed(scope, err);
    } finally {
      await gen.kv_state?.dispose();
    }
  }

  /** Frees a hand-off's state at its source (loaded on first use: the pull module brings undici). */
  function releaseLater(ref: KvTransferRef): void {
    void import('./kv-state-pull.js').then(({ releaseKvState }) => releaseKvState(ref, requestToken));
  }

  /**
   * Pulls a real KV state for this request; a state that is gone, unreachable or refused (another
   * model, a larger context, corrupt bytes, over the size bound) leaves the engine to evaluate the
   * prompt itself: the request still completes, only slower.
   */
  async function takeKvState(scope: RequestScope, ref: KvTransferRef) {
    const importKv = engine.importKv?.bind(engine);
    if (!importKv) return undefined;
    try {
      const { pullKvState } = await import('./kv-state-pull.js');
      const handle = await pullKvState(ref, { importKv }, scope.signal, requestToken);
      onKvPull?.('pulled');
      log.debug({ event: 'kv_state_pulled', request_id: scope.id, transfer_id: ref.transfer_id, tokens: handle.tokens }, 'KV state pulled');
      return handle;
    } catch (err) {
      if (!(err instanceof KvStatePullError)) throw err;
      onKvPull?.(err.outcome);
      log.warn({ event: 'kv_state_not_used', request_id: scope.id, transfer_id: ref.transfer_id, outcome: err.outcome, err: err.message }, `${err.message}; evaluating here instead`);
      return undefined;
    }
  }

  /** Ends a request that did not complete, with the most precise answer its state allows. */
  function failed(scope: RequestScope, err: unknown): void {
    if (scope.dropped) return scope.close('dropped'); // the client left: nobody to answer
    const res = scope.res;
    if (scope.signal.reason instanceof HandOff) return handedOff(scope);
    const cut = scope.signal.reason instanceof ShutdownCut;
    const kvFailed = err instanceof KvPullError;
    // An engine that said what was wrong with the request (e.g. a prompt longer than its context) keeps its code: a 400 stays a 400.
    const said = !cut && !kvFailed && err instanceof EbbError ? err : undefined;
    const code: ErrorCode = cut ? 'worker_shut_down' : kvFailed ? 'kv_transfer_failed' : (said?.code ?? 'engine_error');
    const message = cut ? (scope.signal.reason as Error).message : (err as Error).message;
    if (said !== undefined && said.status < 500) log.info({ event: 'request_refused', request_id: scope.id, code, err: message }, `the engine refused request ${scope.id}: ${message}`);
    else if (!cut) log.error({ err, request_id: scope.id }, 'generation failed');
    if (!res.headersSent) {
      res.writeHead(cut ? 503 : kvFailed ? 502 : (said?.status ?? 500), { 'content-type': 'application/json' });
      scope.end(JSON.stringify(errorBody(code, message)), 'errored');
    } else scope.end(line({ error: { code, message } }), 'errored');
  }

  /** The stream ends with what this worker generated; the caller continues it on another worker. */
  function handedOff(scope: RequestScope): void {
    metrics.handedOff();
    log.info({ event: 'handed_off', request_id: scope.id, completion_tokens: scope.generated }, `request ${scope.id} handed off after ${scope.generated} tokens`);
    const res = scope.res;
    if (!res.headersSent) {
      res.writeHead(503, { 'content-type': 'application/json', 'retry-after': '0' });
      scope.end(JSON.stringify(errorBody('request_handed_off', 'the worker reached its drain deadline before answering; retry on another worker')), 'handed_off');
    } else scope.end(line({ handoff: { reason: 'drain_deadline', completion_tokens: scope.generated, ...(scope.handoffKv ? { kv: scope.handoffKv } : {}) } }), 'handed_off');
  }

  return {
    app,
    get open() {
      return scopes.size;
    },
    cutAll(signal) {
      const these = [...scopes];
      for (const s of these) s.cut();
      return whenClosed(these, signal);
    },
    drainEta() {
      // Admission order: the engine's queue is FIFO, and scopes are kept in insertion order.
      const progress = [...generating].map((s) => ({ budget: s.budget, generated: s.generated }));
      // A prefill in flight (no tokens to count) has no estimate here.
      if (scopes.size > generating.size) return null;
      return estimateDrainMs(progress, pace, engine.stats().batch_slots);
    },
    handOffAll() {
      const these = [...generating];
      for (const s of these) s.handOff();
      return { count: these.length, closed: whenClosed(these) };
    },
  };
}
