import type { EngineCapabilities } from '../protocol/capabilities.js';
import type { ChatMessage, RequestTier, ResponseFormat, TokenLogprob } from '../protocol/request-plane.js';
import type { ToolChoice, ToolSpec } from '../protocol/tools.js';
import type { Sampling } from '../protocol/sampling.js';

export type { EngineCapabilities } from '../protocol/capabilities.js';
import type { KvTransfer, KvTransferStore } from './kv-transfers.js';
import type { KvEventLog } from './kv-event-log.js';
import type { KvCacheDeclaration } from '../protocol/kv-events.js';
import type { EngineAdapters } from './engine-adapters.js';

/**
 * Why a generation's signal aborted when its work is to be continued elsewhere: at a drain deadline
 * (`drain_deadline`) or for a priority request (`preempted`). The worker aborts with a subclass; an
 * engine reads only this (what it keeps for the continuation, what it gives back first).
 */
export class PausedForContinuation extends Error {
  constructor(
    message: string,
    readonly reason: 'drain_deadline' | 'preempted',
  ) {
    super(message);
  }
}

/**
 * The contract between a worker and the engine it hosts. The mocker implements it today; adapters
 * to real OpenAI-compatible engines (vLLM, SGLang, llama.cpp servers) implement the same shape,
 * each with its own engine-owned idleness probe.
 */

export interface GenerateRequest {
  request_id: string;
  /** The prompt as text; for chat requests, the messages joined (engines with a chat template use `messages`). */
  prompt: string;
  /** A prompt given as token ids (engines that declare prompt_token_ids evaluate these, not `prompt`). */
  prompt_token_ids?: number[] | undefined;
  /** Chat requests: the messages, for engines that render them with the model's own template. */
  messages?: ChatMessage[] | undefined;
  /** Tokens to generate now; undefined: until the model stops or its context is full (OpenAI's default). */
  max_tokens?: number | undefined;
  temperature: number;
  top_p?: number | undefined;
  seed?: number | undefined;
  /** Penalties, logit_bias, top_k, min_p, as carried (only ones that change the answer; engines that declare `sampling`). */
  sampling?: Sampling | undefined;
  stop?: string[] | undefined;
  /** Structured output; only sent to engines whose capabilities declare the format (json_object, json_schema). */
  response_format?: ResponseFormat | undefined;
  /**
   * Functions the model may call (only sent to engines that declare `tools`): rendered into the
   * prompt; a call is written in the engine's declared tool_syntax, in its raw text.
   */
  tools?: ToolSpec[] | undefined;
  tool_choice?: ToolChoice | undefined;
  parallel_tool_calls?: boolean | undefined;
  /**
   * Undefined: no logprobs. N (0..20): each generated token's logprob and the N most likely
   * alternatives at its position (only sent to engines whose capabilities declare logprobs).
   */
  logprobs?: number | undefined;
  /**
   * A LoRA adapter to apply (its name; engines with `adapters` only). The worker has made it
   * resident before calling generate and keeps it so until the generation ends.
   */
  adapter?: string | undefined;
  /** Its service tier (absent: default): an engine with a queue of its own serves waiting requests by tier. */
  tier?: RequestTier | undefined;
  /** With tracing on: the W3C traceparent of the worker's span of this request; an engine that calls a server passes it on (vLLM reads it). */
  traceparent?: string | undefined;
  /** Decode side of disaggregated serving: the prompt's KV was pulled from a prefill worker. */
  prefilled?: boolean | undefined;
  /** With `prefilled`: the prompt tokens the prefill worker found cached, which this request's usage reports as cached. */
  prefill_cached_tokens?: number | undefined;
  /**
   * Stream migration: another worker already generated this much of the answer. The engine
   * continues as if it had produced it itself; `max_tokens` is what is left of the budget.
   */
  continuation?: Continuation | undefined;
  /**
   * KV state pulled from another worker (a prefill peer's prompt, or a hand-off's prompt + answer):
   * the engine loads it instead of evaluating those tokens (engines with importKv only).
   */
  kv_state?: KvStateHandle | undefined;
  /**
   * Drain-deadline hand-off: asked when the generation is aborted with `reason`; an engine that can
   * export the running sequence's KV (exportKv engines) does, and reports the transfer it holds.
   */
  kv_handoff?: { wanted(reason: unknown): boolean; exported(transfer: KvTransfer): void } | undefined;
}

/** The field a prompt came in, which a refusal of it names (OpenAI's param for a prompt over the context is `messages`). */
export function promptParam(req: Pick<GenerateRequest, 'messages'>): 'messages' | 'prompt' {
  return req.messages === undefined ? 'prompt' : 'messages';
}

/** A KV state received from a peer, held on this worker until the engine has loaded it. */
export interface KvStateHandle {
  readonly path: string;
  /** Tokens the state holds. */
  readonly tokens: number;
  /** Removes the file; idempotent. */
  dispose(): Promise<void>;
}

/** A KV transfer's payload, as served to the peer that pulls it. */
export interface KvPayload {
  /** Sent as the x-ebb-kv-state header: what the receiver checks before it takes the bytes. */
  header: string;
  bytes: number;
  path: string;
}

/** What POST /tokenize reads of a request. */
export type TokenizeRequest = Pick<GenerateRequest, 'prompt' | 'prompt_token_ids' | 'messages' | 'continuation'>;

export interface Continuation {
  text: string;
  /** Tokens already generated, as counted by the engine that generated them. */
  completion_tokens: number;
  /** The token ids, where the engine that generated them has them: an exact continuation. */
  token_ids?: number[] | undefined;
}

/** One step of a generation: its text, and its token ids where the engine has them. */
export interface GeneratedPiece {
  text: string;
  token_ids?: number[] | undefined;
  /** With `logprobs` asked: one entry per token of the piece. */
  logprobs?: TokenLogprob[] | undefined;
}

export type FinishReason = 'stop' | 'length';

/** One input of an embedding request: text, or token ids of the engine's own tokenizer. */
export type EmbedInput = string | number[];

export interface EmbedOptions {
  /** Shorten every vector to this many dimensions; an engine that cannot refuses with 400 naming `dimensions`. */
  dimensions?: number | undefined;
}

export interface EmbedResult {
  /** One per input, in order. */
  vectors: Float32Array[];
  prompt_tokens: number;
}

export interface GenerateResult {
  finish_reason: FinishReason;
  prompt_tokens: number;
  /** Tokens this call generated (a continuation's earlier tokens are not counted again). */
  completion_tokens: number;
  /**
   * Prompt tokens cached before the request arrived: found in this engine's prefix cache, or, for a
   * prompt whose KV it loaded from a prefill peer, in that peer's (`prefill_cached_tokens`). A KV
   * loaded from a hand-off is not counted: that request computed it. Absent: it cannot tell.
   */
  cached_tokens?: number | undefined;
}

/**
 * What the engine can say about its own idleness. `unknown` is a first-class answer: the worker
 * treats it as "not idle" (fail-closed), so an engine that cannot tell never yields a false drained.
 */
export type Quiescence =
  | { state: 'idle' }
  | { state: 'busy'; waiting_for: string[] }
  | { state: 'unknown'; reason: string };

export interface EngineStats {
  kind: string;
  running_sequences: number;
  queued_sequences: number;
  batch_slots: number;
  [extra: string]: unknown;
}

/** An engine server's own scheduler figures, as its /metrics page reports them. */
export interface SchedulerGauges {
  running: number;
  waiting: number;
  /** KV cache use, 0 to 1, where the page has it. */
  kv_cache_usage?: number;
}

/** An engine's prefix cache as GET /engine/status shows it (`kv_cache`). */
export interface KvCacheStats {
  block_size: number;
  /** null where the engine does not say. */
  capacity_blocks: number | null;
  /** Blocks held, pinned by running sequences or not: what a scale-down weighs as the worker's cache value. */
  cached_blocks: number;
  pinned_blocks?: number | undefined;
  /** Prompt tokens found cached, and computed, since the engine started (where it counts them). */
  prompt_tokens_hit?: number | undefined;
  prompt_tokens_missed?: number | undefined;
  /** prompt_tokens_hit over all prompt tokens seen; 0 before the first. */
  hit_rate?: number | undefined;
}

export interface Engine {
  readonly kind: string;
  readonly capabilities: EngineCapabilities;
  /**
   * Refuses, before any answer is sent, a request this engine cannot run: rejects with an EbbError
   * carrying the caller's code (invalid_request), which the worker answers with its status instead
   * of opening a stream that fails at once. Absent: generate finds every problem itself.
   */
  check?(req: GenerateRequest): Promise<void>;
  /**
   * The token ids this engine's prefix cache hashes for a request: for chat, the prompt as the
   * engine renders it; a continuation's tokens follow the prompt's. Served as POST /tokenize, for
   * the frontend to hash prompts as the worker does (kv_cache tokenizer `worker`).
   */
  tokenize?(req: TokenizeRequest, signal: AbortSignal): Promise<number[]>;
  /** Yields pieces (tokens); returns how the sequence ended. Aborting `signal` stops it promptly. */
  generate(req: GenerateRequest, signal: AbortSignal): AsyncGenerator<GeneratedPiece, GenerateResult, void>;
  /** Asked when the worker's in-flight count reaches 0 during a drain, and again on every change event. */
  probeQuiescence(): Promise<Quiescence>;
  /** Fires when the answer of probeQuiescence may have changed (e.g. the last sequence finished). */
  onQuiescenceChange(listener: () => void): () => void;
  /** True when new work would only queue past the engine's limit: an overload, never a drain. */
  isOverloaded(): boolean;
  /**
   * Embeds every input (POST /embed): present where capabilities.embeddings is true. Holds what a
   * generation would (a batch slot), so the engine's load and idleness include it.
   */
  embed?(inputs: EmbedInput[], opts: EmbedOptions, signal: AbortSignal): Promise<EmbedResult>;
  /** Prefill side of disaggregated serving: compute the prompt's KV and hold it for a decode peer. */
  prefill?(req: GenerateRequest, signal: AbortSignal): Promise<KvTransfer>;
  /** The KV transfers a prefill engine holds for decode peers; absent where there are none. */
  readonly kvTransfers?: KvTransferStore | undefined;
  /** An engine with a prefix cache it can report: what it stored and evicted, served as GET /kv/events. */
  readonly kvEvents?: KvEventLog | undefined;
  /**
   * The prefix cache the worker's discovery record declares. Absent: the kvEvents log's declaration
   * (exact events) where there is one, else none (the frontend then routes without cache knowledge).
   */
  readonly kvCache?: KvCacheDeclaration | undefined;
  /** The prefix cache's state now. Absent: the system server shows what the kvEvents log holds. */
  kvCacheStats?(): KvCacheStats;
  /** The bytes of a pending transfer, for GET /kv/{id}; absent: the engine simulates them (mocker). */
  kvPayload?(transferId: string): KvPayload | undefined;
  /**
   * Receives a peer's KV state (its x-ebb-kv-state header, then `bytes` of body), checked against
   * this engine (model, context, integrity, size bound); rejects with KvStateRefused otherwise.
   */
  importKv?(header: string, bytes: number, body: AsyncIterable<Uint8Array>, signal: AbortSignal): Promise<KvStateHandle>;
  /**
   * An engine that can die on its own (a child process, a remote server) reports it here: the
   * worker leaves discovery at once, fails /live and exits non-zero so its supervisor restarts it.
   */
  onFailure?(listener: (err: Error) => void): () => void;
  /** LoRA adapters over the base model; absent: the engine serves its base model only. */
  readonly adapters?: EngineAdapters | undefined;
  stats(): EngineStats;
  /**
   * An engine server's own running, waiting and KV-use gauges (read at scrape time, bounded), for
   * the worker's picker metrics; absent for an engine that has none (its stats() are its figures).
   */
  schedulerGauges?(): Promise<SchedulerGauges | undefined>;
  close(): Promise<void>;
}
