import type { Logger } from 'pino';
import { writeWithBackpressure } from '../common/backpressure.js';
import type { Engine, GeneratedPiece, GenerateRequest, GenerateResult } from '../engine/engine.js';
import { EbbError, errorBody, type ErrorCode } from '../protocol/errors.js';
import type { KvTransferRef, StreamLine, TokenLogprob, Usage } from '../protocol/request-plane.js';
import type { TokenPace } from './drain-eta.js';
import { KvPullError } from './kv-pull-error.js';
import { KvStatePullError, type KvPullOutcome } from './kv-state-wire.js';
import type { WorkerMetrics } from './metrics.js';
import { HandOff, ShutdownCut, type RequestScope } from './request-scope.js';
import { ATTR } from '../tracing/attributes.js';

export interface GenerationDeps {
  workerId: string;
  engine: Engine;
  metrics: WorkerMetrics;
  log: Logger;
  /** This request plane's own URL, where the next worker pulls a handed-off sequence's state. */
  selfUrl: () => string;
  /** Sent to peers when pulling KV. */
  requestToken?: string | undefined;
  /** Counts each pull of a real KV state by how it ended. */
  onKvPull?: ((outcome: KvPullOutcome) => void) | undefined;
  pace: TokenPace;
}

function usageOf(r: GenerateResult): Usage {
  const usage: Usage = { prompt_tokens: r.prompt_tokens, completion_tokens: r.completion_tokens, total_tokens: r.prompt_tokens + r.completion_tokens };
  // Only where the engine can tell: an engine without a prefix cache says nothing, not 0.
  if (r.cached_tokens !== undefined) usage.prompt_tokens_details = { cached_tokens: r.cached_tokens };
  return usage;
}

const line = (l: StreamLine) => JSON.stringify(l) + '\n';

/** A piece's line; a piece without ids or logprobs keeps the plain `{"text":...}` shape the frontend reads fastest. */
function pieceLine(piece: GeneratedPiece): string {
  if (piece.logprobs !== undefined) return line({ text: piece.text, ...(piece.token_ids ? { token_ids: piece.token_ids } : {}), logprobs: piece.logprobs });
  return line(piece.token_ids ? { text: piece.text, token_ids: piece.token_ids } : { text: piece.text });
}

/**
 * One admitted request's answer on the request plane: its KV pulled (a decode worker's, a
 * continuation's hand-off state), its tokens streamed as NDJSON lines (or collected), and every way
 * it can end answered as precisely as its state allows: a terminal line, a hand-off line, or an
 * error body before any byte went out.
 */
export class Generations {
  constructor(private readonly deps: GenerationDeps) {}

  /** The scope owns the request from admission: every way out below ends in scope.end or scope.close. */
  async serve(scope: RequestScope, gen: GenerateRequest, stream: boolean, kv: KvTransferRef | undefined, handoffKv?: KvTransferRef): Promise<void> {
    const { engine, metrics, log, pace, workerId, selfUrl, requestToken } = this.deps;
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
        if (handoffKv) this.releaseLater(handoffKv);
        gen.kv_state = await this.takeKvState(scope, kv);
      } else if (kv) {
        // Loaded on the first pull: only a mocker decode worker pulls this way, and the module brings undici.
        const { pullKv } = await import('./kv-pull.js');
        const pull = scope.trace?.child('ebb.kv.pull', { [ATTR.transferId]: kv.transfer_id, [ATTR.kvSource]: kv.worker_id });
        const bytes = await pullKv(kv, scope.signal, requestToken, pull).catch((err: unknown) => {
          pull?.end('failed', { code: 'kv_transfer_failed', message: (err as Error).message });
          throw err;
        });
        pull?.span.setAttribute(ATTR.kvBytes, bytes);
        pull?.end('pulled');
        log.debug({ event: 'kv_pulled', request_id: scope.id, transfer_id: kv.transfer_id, kv_bytes: bytes, ...scope.trace?.logIds() }, 'KV pulled from prefill worker');
      } else if (handoffKv && engine.importKv) gen.kv_state = await this.takeKvState(scope, handoffKv);
      // An engine that cannot load it re-evaluates; the source must not wait for it until its TTL.
      else if (handoffKv) this.releaseLater(handoffKv);
      // A request whose adapter is loading waits for it here: admitted, alive, counted.
      await scope.adapterReady();
      if (scope.adapter !== undefined) scope.trace?.event('adapter_ready', { [ATTR.adapter]: scope.adapter.name });
      const tokens = scope.attach(engine.generate(gen, scope.signal));
      if (stream) {
        let step = await tokens.next();
        scope.trace?.firstToken();
        while (!step.done) {
          const piece = step.value;
          scope.piece(piece.token_ids?.length ?? 1, pace);
          await writeWithBackpressure(res, pieceLine(piece), scope.signal);
          step = await tokens.next();
        }
        metrics.promptTokens(step.value.prompt_tokens, step.value.cached_tokens);
        scope.trace?.usage(step.value, scope.maxGapMs);
        scope.end(line({ done: true, finish_reason: step.value.finish_reason, usage: usageOf(step.value) }), 'completed');
      } else {
        let text = '';
        const logprobs: TokenLogprob[] | undefined = gen.logprobs === undefined ? undefined : [];
        let step = await tokens.next();
        scope.trace?.firstToken();
        while (!step.done) {
          text += step.value.text;
          if (logprobs !== undefined && step.value.logprobs !== undefined) for (const l of step.value.logprobs) logprobs.push(l);
          scope.piece(step.value.token_ids?.length ?? 1, pace);
          step = await tokens.next();
        }
        metrics.promptTokens(step.value.prompt_tokens, step.value.cached_tokens);
        scope.trace?.usage(step.value, scope.maxGapMs);
        const payload = JSON.stringify({ text, finish_reason: step.value.finish_reason, usage: usageOf(step.value), ...(logprobs !== undefined ? { logprobs } : {}) });
        res.writeHead(200, { 'content-type': 'application/json', 'x-request-id': scope.id });
        scope.end(payload, 'completed');
      }
    } catch (err) {
      // The engine exports a handed-off sequence as its generator ends: before the hand-off line names it.
      if (scope.signal.reason instanceof HandOff) await scope.settle();
      this.failed(scope, err);
    } finally {
      await gen.kv_state?.dispose();
    }
  }

  /** Ends a request that did not complete, with the most precise answer its state allows. */
  failed(scope: RequestScope, err: unknown): void {
    const { log } = this.deps;
    if (scope.dropped) return scope.close('dropped'); // the client left: nobody to answer
    const res = scope.res;
    if (scope.signal.reason instanceof HandOff) return this.handedOff(scope);
    const cut = scope.signal.reason instanceof ShutdownCut;
    const kvFailed = err instanceof KvPullError;
    // An engine that said what was wrong with the request (e.g. a prompt longer than its context) keeps its code: a 400 stays a 400.
    const said = !cut && !kvFailed && err instanceof EbbError ? err : undefined;
    const code: ErrorCode = cut ? 'worker_shut_down' : kvFailed ? 'kv_transfer_failed' : (said?.code ?? 'engine_error');
    const message = cut ? (scope.signal.reason as Error).message : (err as Error).message;
    const ids = scope.trace?.logIds();
    if (said !== undefined && said.status < 500) log.info({ event: 'request_refused', request_id: scope.id, code, err: message, ...ids }, `the engine refused request ${scope.id}: ${message}`);
    else if (!cut) log.error({ err, request_id: scope.id, ...ids }, 'generation failed');
    // A request the engine refused (a 4xx) is the caller's to fix, not the worker failing.
    if (said === undefined || said.status >= 500) scope.trace?.fail(code, message);
    if (!res.headersSent) {
      res.writeHead(cut ? 503 : kvFailed ? 502 : (said?.status ?? 500), { 'content-type': 'application/json' });
      // The field at fault, where the engine named it (OpenAI's `param`): the frontend passes it on.
      scope.end(JSON.stringify(errorBody(code, message, said?.param === undefined ? {} : { param: said.param })), 'errored');
    } else scope.end(line({ error: { code, message } }), 'errored');
  }

  /** The stream ends with what this worker generated; the caller continues it (elsewhere after a drain deadline; later, anywhere, after a preemption). */
  private handedOff(scope: RequestScope): void {
    const why = scope.signal.reason as HandOff;
    scope.trace?.event(why.reason === 'preempted' ? 'preempted' : 'handed_off', { [ATTR.outputTokens]: scope.generated, ...(scope.handoffKv ? { [ATTR.transferId]: scope.handoffKv.transfer_id } : {}) });
    // A preemption is counted and logged where it is decided (preemption.ts).
    if (why.reason === 'drain_deadline') {
      this.deps.metrics.handedOff();
      this.deps.log.info({ event: 'handed_off', request_id: scope.id, completion_tokens: scope.generated, ...scope.trace?.logIds() }, `request ${scope.id} handed off after ${scope.generated} tokens`);
    }
    const res = scope.res;
    if (!res.headersSent) {
      res.writeHead(503, { 'content-type': 'application/json', 'retry-after': '0' });
      scope.end(JSON.stringify(errorBody('request_handed_off', why.reason === 'preempted' ? `${why.message} before it answered; retry` : 'the worker reached its drain deadline before answering; retry on another worker')), 'handed_off');
    } else scope.end(line({ handoff: { reason: why.reason, completion_tokens: scope.generated, ...(scope.handoffKv ? { kv: scope.handoffKv } : {}) } }), 'handed_off');
  }

  /** Frees a hand-off's state at its source (loaded on first use: the pull module brings undici). */
  private releaseLater(ref: KvTransferRef): void {
    void import('./kv-state-pull.js').then(({ releaseKvState }) => releaseKvState(ref, this.deps.requestToken));
  }

  /**
   * Pulls a real KV state for this request; a state that is gone, unreachable or refused (another
   * model, a larger context, corrupt bytes, over the size bound) leaves the engine to evaluate the
   * prompt itself: the request still completes, only slower.
   */
  private async takeKvState(scope: RequestScope, ref: KvTransferRef) {
    const { engine, log, onKvPull, requestToken } = this.deps;
    const importKv = engine.importKv?.bind(engine);
    if (!importKv) return undefined;
    const pull = scope.trace?.child('ebb.kv.pull', { [ATTR.transferId]: ref.transfer_id, [ATTR.kvSource]: ref.worker_id });
    try {
      const { pullKvState } = await import('./kv-state-pull.js');
      const handle = await pullKvState(ref, { importKv }, scope.signal, requestToken, pull);
      onKvPull?.('pulled');
      pull?.end('pulled');
      log.debug({ event: 'kv_state_pulled', request_id: scope.id, transfer_id: ref.transfer_id, tokens: handle.tokens, ...scope.trace?.logIds() }, 'KV state pulled');
      return handle;
    } catch (err) {
      pull?.end(err instanceof KvStatePullError ? err.outcome : 'failed', { code: 'kv_transfer_failed', message: (err as Error).message });
      if (!(err instanceof KvStatePullError)) throw err;
      onKvPull?.(err.outcome);
      log.warn({ event: 'kv_state_not_used', request_id: scope.id, transfer_id: ref.transfer_id, outcome: err.outcome, err: err.message, ...scope.trace?.logIds() }, `${err.message}; evaluating here instead`);
      return undefined;
    }
  }
}
