import type { AdapterSource } from './engine-adapters.js';

/**
 * Settings of the llama-cpp engine, apart from the engine itself: the CLI reads these without
 * loading node-llama-cpp (its native bindings load only in a worker that runs the engine).
 */

export type LlamaGpu = 'auto' | 'cuda' | 'vulkan' | 'off';

export interface LlamaCppOptions {
  modelPath: string;
  /** Sequences evaluated together in one context (continuous batching); more requests queue. */
  parallel: number;
  /** Queued requests beyond which the engine reports overload (the worker answers worker_overloaded). */
  maxQueue: number;
  /** Tokens per sequence (prompt + answer); undefined: the model's training context, up to what fits. */
  contextSize?: number | undefined;
  threads: number;
  gpu: LlamaGpu;
  /**
   * One sequence per llama.cpp decode instead of continuous batching: an answer's arithmetic no
   * longer depends on what else runs (see llama-cpp.ts), at the cost of the batching throughput.
   */
  batchInvariant?: boolean | undefined;
  /**
   * One llama.cpp sequence more than `parallel` (never more batch slots): a stream paused for a
   * priority request gives its slot back before its state is written (spare-sequence.ts). Costs
   * one sequence's KV cells more, 1/parallel of the context's KV memory.
   */
  preemptionSpareSequence?: boolean | undefined;
  /** Bytes of KV state files (prefill transfers, hand-offs, pulled states) held at once; default 2 GiB. */
  kvStateMaxBytes?: number | undefined;
  /** How long an exported KV state waits for its peer to pull it; default 30 s. */
  kvTransferTtlMs?: number | undefined;
  /** LoRA adapters available at start (--lora NAME=PATH); loaded when the worker asks. */
  loras?: AdapterSource[] | undefined;
  /** Adapters resident at once (--lora-slots): each holds a context of its own. */
  loraSlots?: number | undefined;
}

export const LLAMA_CPP_DEFAULTS = {
  parallel: 4,
  maxQueue: 64,
  // node-llama-cpp's default uses every core; on a shared 2-core machine a 64-token generation of a
  // tiny model took 21 s that way and 48 ms with one thread (spinning threads fight each other and
  // everything else). One thread is the safe default on CPU; --threads raises it on a dedicated box.
  threads: 1,
  gpu: 'auto' as LlamaGpu,
  // Each resident adapter holds a context as large as the base one (its KV cache): one by default.
  loraSlots: 1,
};
