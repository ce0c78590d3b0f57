import type { FastifyReply } from 'fastify';
import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import type { Engine, GenerateRequest } from '../engine/engine.js';
import type { Admission, RefusalCode } from '../lifecycle/admission.js';
import { capabilitiesNeeded, embeddingNeeds, missingCapability } from '../protocol/capabilities.js';
import { EbbError, errorBody } from '../protocol/errors.js';
import { promptOf, type EmbedBody, type GenerateBody, type KvTransferRef } from '../protocol/request-plane.js';
import { samplingOf, SAMPLING_FIELDS } from '../protocol/sampling.js';
import { boundSchemas } from '../protocol/schema-bounds.js';
import type { WorkerMode } from '../protocol/worker-mode.js';
import type { WorkerMetrics } from './metrics.js';
import type { OpenRequests } from './open-requests.js';
import type { PrefillPeers } from './prefill-peers.js';
import type { PriorityReserve } from './priority-reserve.js';
import { RequestScope } from './request-scope.js';
import type { AdapterRefusal, WorkerAdapters } from './adapters.js';
import type { WorkerTrace } from '../tracing/worker-trace.js';
import { ATTR } from '../tracing/attributes.js';

export interface RequestGateDeps {
  model: string;
  mode: WorkerMode;
  engine: Engine;
  admission: Admission;
  metrics: WorkerMetrics;
  log: Logger;
  prefillPeers?: PrefillPeers | undefined;
  /** The engine's LoRA adapters, where it has any. */
  adapters?: WorkerAdapters | undefined;
  /** The drain's ETA (ms) while draining, null when none is known: a draining refusal's Retry-After. */
  drainEtaMs?: (() => number | null) | undefined;
  /** The batch slots flex requests leave free (--priority-reserve-slots). */
  priorityReserve?: PriorityReserve | undefined;
}

const REFUSALS: Record<RefusalCode | AdapterRefusal, string> = {
  worker_draining: 'worker is draining; retry on another worker',
  worker_overloaded: 'worker is overloaded; retry shortly or elsewhere',
  adapter_draining: "the request's adapter is draining on this worker; retry on another worker",
  adapter_slots_busy: 'every adapter slot of this worker holds an adapter with requests in flight; retry on another worker',
};

/** A refusal's body: the caller retries elsewhere (draining) or shortly (overloaded). */
export function refusal(code: RefusalCode | AdapterRefusal) {
  return errorBody(code, REFUSALS[code]);
}

/**
 * What a /generate or /prefill must be to be admitted, and the one admission point: a request this
 * worker cannot serve is refused with its reason before admission; an admitted one gets its scope
 * (which owns it from here until its stream ends) and the engine's request.
 */
export class RequestGate {
  constructor(
    private readonly deps: RequestGateDeps,
    private readonly open: OpenRequests,
  ) {}

  /**
   * Answers a refusal: 503 with its body; a draining one says when the drain should be over (its
   * ETA, the soonest this worker's state changes), others a short retry.
   */
  refuse(reply: FastifyReply, code: RefusalCode | AdapterRefusal): FastifyReply {
    const eta = code === 'worker_draining' ? this.deps.drainEtaMs?.() : undefined;
    const retry = code !== 'worker_draining' ? '1' : eta === null || eta === undefined ? undefined : String(Math.max(1, Math.ceil(eta / 1000)));
    if (retry !== undefined) void reply.header('retry-after', retry);
    return reply.code(503).send(refusal(code));
  }

  /** `trace`: the worker's span of the request (tracing on): its admission and outcome are told there. */
  admit(body: GenerateBody, res: RequestScope['res'], trace?: WorkerTrace): { gen: GenerateRequest; scope: RequestScope } | { refused: RefusalCode | AdapterRefusal } {
    const { model, engine } = this.deps;
    if (body.model !== model) throw new EbbError('model_not_found', `this worker serves "${model}", not "${body.model}"`);
    const prompt = promptOf(body);
    if (prompt === undefined) throw new EbbError('invalid_request', 'one of prompt, messages or prompt_token_ids is required', { param: 'prompt' });
    if (body.kv_transfer !== undefined) this.checkKvSource(body.kv_transfer);
    // A hand-off's state comes with its continuation.
    if (body.handoff_kv !== undefined && body.continuation === undefined) throw new EbbError('invalid_request', 'handoff_kv is only accepted with a continuation', { param: 'handoff_kv' });
    const lacking = missingCapability(engine.capabilities, capabilitiesNeeded(body));
    if (lacking === 'continuation')
      throw new EbbError('continuation_unsupported', `this worker's engine (${engine.kind}) cannot continue a sequence another worker started`);
    // The frontend routes only to workers that declare it; a direct caller gets the same answer.
    if (lacking === 'tools') throw new EbbError('unsupported_parameter', `this worker's engine (${engine.kind}) cannot call tools`, { param: 'tools' });
    if (lacking === 'logprobs') throw new EbbError('unsupported_parameter', `this worker's engine (${engine.kind}) cannot report logprobs`, { param: 'logprobs' });
    if (lacking === 'sampling') {
      const field = SAMPLING_FIELDS.find((f) => body[f] !== undefined)!;
      throw new EbbError('unsupported_parameter', `this worker's engine (${engine.kind}) cannot honour ${field}`, { param: field });
    }
    if (lacking !== undefined) throw new EbbError('unsupported_parameter', `this worker's engine (${engine.kind}) cannot honour response_format ${lacking}`, { param: 'response_format' });
    // What a schema may make the engine do is bounded before any engine sees it (a direct caller's too).
    boundSchemas(body.response_format, body.tools);
    if (body.tool_choice !== undefined && typeof body.tool_choice !== 'string' && !body.tools?.some((t) => t.function.name === (body.tool_choice as { function: { name: string } }).function.name))
      throw new EbbError('invalid_request', `tool_choice names function "${body.tool_choice.function.name}", which is not in tools`, { param: 'tool_choice' });
    const requestId = body.request_id ?? randomUUID();
    // Flex only into a free slot beyond the priority reserve: refused here, it waits in the
    // frontend's queue (which this worker's status wakes), not in the engine's ahead of priority work.
    if (body.service_tier === 'flex' && this.deps.admission.open && this.deps.priorityReserve?.flexRoom === false) {
      this.deps.metrics.refused('worker_overloaded');
      trace?.outcome('refused: worker_overloaded');
      return { refused: 'worker_overloaded' };
    }
    // The adapter first: its admission and the worker's are one synchronous step, so neither a
    // drain of the adapter nor the worker's can fall between them. A worker that refuses anyway
    // (draining) starts no load.
    const hold = body.adapter === undefined || !this.deps.admission.open ? undefined : this.admitAdapter(body.adapter, trace);
    if (hold !== undefined && 'refused' in hold) {
      this.deps.metrics.refused(hold.refused);
      trace?.outcome(`refused: ${hold.refused}`);
      return hold;
    }
    const opened = this.openScope(requestId, res, trace);
    if ('refused' in opened) {
      hold?.release();
      return opened;
    }
    const { scope } = opened;
    scope.adapter = hold;
    scope.tier = body.service_tier ?? 'default';
    scope.preemptible = body.preemptible === true && body.service_tier === 'flex';
    // What the drain ETA counts down from: the budget, or the context left where the engine has one
    // (an upper bound: the prompt's share of it is the engine's to count).
    const maxContext = engine.capabilities.max_context;
    scope.budget = body.max_tokens ?? (maxContext === null ? undefined : Math.max(0, maxContext - (body.continuation?.completion_tokens ?? 0)));
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
      sampling: samplingOf(body),
      stop: typeof body.stop === 'string' ? [body.stop] : body.stop,
      prefilled: body.kv_transfer !== undefined,
      prefill_cached_tokens: body.kv_transfer?.cached_tokens,
      continuation: body.continuation,
      response_format: body.response_format?.type === 'text' ? undefined : body.response_format,
      ...(body.tools !== undefined && body.tools.length > 0 && { tools: body.tools, tool_choice: body.tool_choice ?? 'auto', parallel_tool_calls: body.parallel_tool_calls ?? true }),
      logprobs: body.logprobs === true ? (body.top_logprobs ?? 0) : undefined,
      adapter: body.adapter,
      tier: body.service_tier,
    };
    if (trace?.traceparent !== undefined) gen.traceparent = trace.traceparent;
    return { gen, scope };
  }

  private admitAdapter(name: string, trace: WorkerTrace | undefined) {
    const adapters = this.deps.adapters;
    if (adapters === undefined) throw new EbbError('adapter_not_found', `this worker's engine (${this.deps.engine.kind}) serves no adapters, not "${name}"`);
    return adapters.admit(name, trace);
  }

  /**
   * An embedding (POST /embed): checked as a generation is (its model, what it needs of the engine),
   * then admitted through the same admission, so a drain counts it and waits for it.
   */
  admitEmbedding(body: EmbedBody, res: RequestScope['res'], trace?: WorkerTrace): { scope: RequestScope } | { refused: RefusalCode } {
    const { model, engine } = this.deps;
    if (body.model !== model) throw new EbbError('model_not_found', `this worker serves "${model}", not "${body.model}"`);
    const lacking = missingCapability(engine.capabilities, embeddingNeeds(body));
    if (lacking !== undefined) throw new EbbError('unsupported_parameter', `this worker's engine (${engine.kind}) cannot embed ${lacking === 'embeddings' ? 'inputs' : 'token-id inputs'}`, { param: lacking === 'embeddings' ? 'model' : 'input' });
    return this.openScope(body.request_id ?? randomUUID(), res, trace);
  }

  /** The one admission point: a refusal counted, or the request's scope, open until its response ends. */
  private openScope(requestId: string, res: RequestScope['res'], trace: WorkerTrace | undefined): { scope: RequestScope } | { refused: RefusalCode } {
    const { engine, admission, metrics } = this.deps;
    const admitted = admission.admit(requestId);
    if (!admitted.admitted) {
      metrics.refused(admitted.code);
      trace?.outcome(`refused: ${admitted.code}`);
      return { refused: admitted.code };
    }
    const scope = new RequestScope(admitted.ticket, res, this.open.onClose);
    if (trace !== undefined) {
      scope.trace = trace;
      trace.event('admitted', { [ATTR.requestId]: requestId });
    }
    scope.admittedToFreeSlot = this.open.size < engine.stats().batch_slots;
    this.open.add(scope);
    return { scope };
  }

  /**
   * A hand-off's state is pulled, or freed at its source, only when that source is a worker this one
   * has seen registered: a request body must not make a worker call an arbitrary URL. A source it
   * has not seen (one that left discovery before this worker started, say) is no reason to refuse
   * the stream: it continues by re-evaluation, as after a crash.
   */
  trustedHandoff(ref: KvTransferRef | undefined): KvTransferRef | undefined {
    if (ref === undefined || this.deps.prefillPeers?.trusts(ref, 'any')) return ref;
    this.deps.log.warn(
      { event: 'handoff_kv_untrusted', worker_id: ref.worker_id, source_url: ref.source_url },
      `hand-off state from ${ref.worker_id} not used: no worker registered by that id at that URL in this worker's view; re-evaluating`,
    );
    return undefined;
  }

  /** Only decode workers pull KV, and only from a prefill worker registered in their discovery view. */
  private checkKvSource(ref: KvTransferRef): void {
    const { mode, prefillPeers } = this.deps;
    if (mode !== 'decode') throw new EbbError('invalid_request', `kv_transfer is only accepted by decode workers; this worker is ${mode}`, { param: 'kv_transfer' });
    if (!prefillPeers?.trusts(ref)) throw new EbbError('forbidden', `kv_transfer source is not a registered prefill worker (worker_id "${ref.worker_id}" at that URL)`);
  }
}
