import type { KvTransfer, KvTransferStore } from './kv-transfers.js';

/**
 * The contract between a worker and the engine it hosts. The mocker implements it today; adapters
 * to real OpenAI-compatible engines (vLLM, SGLang, llama.cpp servers) implement the same shape,
 * each with its own engine-owned idleness probe.
 */

export interface GenerateRequest {
  request_id: string;
  prompt: string;
  max_tokens: number;
  temperature: number;
  seed?: number | undefined;
  stop?: string[] | undefined;
  /** Decode side of disaggregated serving: the prompt's KV was pulled from a prefill worker. */
  prefilled?: boolean | undefined;
}

export type FinishReason = 'stop' | 'length';

export interface GenerateResult {
  finish_reason: FinishReason;
  prompt_tokens: number;
  completion_tokens: number;
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

export interface Engine {
  readonly kind: string;
  /** Yields text pieces (tokens); returns how the sequence ended. Aborting `signal` stops it promptly. */
  generate(req: GenerateRequest, signal: AbortSignal): AsyncGenerator<string, GenerateResult, void>;
  /** Asked when the worker's in-flight count reaches 0 during a drain, and again on every change event. */
  probeQuiescence(): Promise<Quiescence>;
  /** Fires when the answer of probeQuiescence may have changed (e.g. the last sequence finished). */
  onQuiescenceChange(listener: () => void): () => void;
  /** True when new work would only queue past the engine's limit: an overload, never a drain. */
  isOverloaded(): boolean;
  /** Prefill side of disaggregated serving: compute the prompt's KV and hold it for a decode peer. */
  prefill?(req: GenerateRequest, signal: AbortSignal): Promise<KvTransfer>;
  /** The KV transfers a prefill engine holds for decode peers; absent where there are none. */
  readonly kvTransfers?: KvTransferStore | undefined;
  stats(): EngineStats;
  close(): Promise<void>;
}
