import { basename } from 'node:path';
import { InvalidArgumentError, Option } from 'commander';
import type { EngineSpec } from '../engine/create-engine.js';
import { LLAMA_CPP_DEFAULTS, type LlamaGpu } from '../engine/llama-cpp-options.js';
import { intOption } from './options.js';
import type { AdapterSource } from '../engine/engine-adapters.js';

/** The worker flags of `--engine llama-cpp`. */
export interface LlamaCppFlags {
  engine: string;
  model?: string;
  modelPath?: string;
  parallel: number;
  contextSize?: number;
  threads: number;
  gpu: LlamaGpu;
  maxQueue: number;
  batchInvariant?: boolean;
  preemptionSpareSequence?: boolean;
  kvStateMaxMb?: number;
  /** Shared with the mocker's prefill workers (--kv-transfer-ttl-ms). */
  kvTransferTtlMs?: number;
  /** --lora (one flag for every engine: lora-flag.ts). */
  lora?: AdapterSource[];
  loraSlots: number;
}

export function llamaCppOptions(): Option[] {
  return [
    new Option('--model-path <file>', 'llama-cpp: the GGUF model file to load'),
    new Option('--parallel <n>', 'llama-cpp: sequences evaluated together (continuous batching); more requests queue').argParser(intOption(1)).default(LLAMA_CPP_DEFAULTS.parallel),
    new Option('--context-size <n>', "llama-cpp: tokens per sequence, prompt + answer (default: the model's training context, as memory allows)").argParser(intOption(16)),
    new Option('--threads <n>', 'llama-cpp: CPU threads for evaluation (more spin every core and slow a shared machine down)').argParser(intOption(1)).default(LLAMA_CPP_DEFAULTS.threads),
    new Option('--gpu <kind>', 'llama-cpp: GPU backend, or off for CPU only').choices(['auto', 'cuda', 'vulkan', 'off']).default(LLAMA_CPP_DEFAULTS.gpu),
    new Option('--max-queue <n>', 'llama-cpp: queued requests past which the worker answers worker_overloaded').argParser(intOption(0)).default(LLAMA_CPP_DEFAULTS.maxQueue),
    new Option('--kv-state-max-mb <n>', 'llama-cpp: disk bound for KV state files (prefill transfers, hand-offs, pulled states) held at once').argParser(intOption(1)).default(2048),
    new Option('--lora-slots <n>', 'llama-cpp: LoRA adapters resident at once (each holds a llama.cpp context as large as the base one)').argParser(intOption(1)).default(LLAMA_CPP_DEFAULTS.loraSlots),
    new Option(
      '--preemption-spare-sequence',
      "llama-cpp: one llama.cpp sequence more than --parallel (batch slots stay --parallel): a priority request that pauses a flex stream starts on the spare at once instead of waiting for the paused stream's decode and state file; costs one sequence's KV cache more (1/parallel of the context's KV memory, +25 % at --parallel 4)",
    ),
    new Option('--batch-invariant', 'llama-cpp: one sequence per decode, no batching: a temperature-0 answer (and a migrated one) is the same whatever else runs, at the cost of throughput'),
  ];
}

/** The model name a worker serves: --model, else the GGUF file's name for llama-cpp. */
export function servedModelName(flags: Pick<LlamaCppFlags, 'engine' | 'model' | 'modelPath'>, fallback: string): string {
  if (flags.model !== undefined) return flags.model;
  if (flags.engine === 'llama-cpp' && flags.modelPath !== undefined) return basename(flags.modelPath).replace(/\.gguf$/i, '');
  return fallback;
}

export function llamaCppSpec(flags: LlamaCppFlags): EngineSpec {
  if (flags.modelPath === undefined) throw new InvalidArgumentError('--engine llama-cpp needs --model-path FILE.gguf');
  return {
    kind: 'llama-cpp',
    options: {
      modelPath: flags.modelPath,
      parallel: flags.parallel,
      maxQueue: flags.maxQueue,
      contextSize: flags.contextSize,
      threads: flags.threads,
      gpu: flags.gpu,
      batchInvariant: flags.batchInvariant === true,
      preemptionSpareSequence: flags.preemptionSpareSequence === true,
      kvStateMaxBytes: flags.kvStateMaxMb === undefined ? undefined : flags.kvStateMaxMb * 1024 * 1024,
      kvTransferTtlMs: flags.kvTransferTtlMs,
      loras: flags.lora ?? [],
      loraSlots: flags.loraSlots,
    },
  };
}
