/**
 * The `--engine openai` choices the CLI parses, apart from the engine itself: the engine's module
 * loads undici and its HTTP clients, which a mocker or llama-cpp worker never uses.
 */

/** The engine servers ebb knows the idleness signal of; `generic` is any other OpenAI-compatible server. */
export const ENGINE_KINDS = ['vllm', 'sglang', 'llamacpp', 'generic'] as const;
export type EngineKind = (typeof ENGINE_KINDS)[number];

/** `probe`: the engine's own signal (fail-closed); `trust-inflight`: ebb's own count only (weaker). */
export const QUIESCENCE_MODES = ['probe', 'trust-inflight'] as const;
export type QuiescenceMode = (typeof QUIESCENCE_MODES)[number];

export const OPENAI_ENGINE_DEFAULTS = { stopTimeoutMs: 10_000, loadTimeoutMs: 900_000 } as const;
