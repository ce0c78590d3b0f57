import { InvalidArgumentError, Option } from 'commander';
import type { AdapterSource } from '../engine/engine-adapters.js';
import { isAdapterName } from '../protocol/adapters.js';

/**
 * `--lora NAME=PATH`: a LoRA adapter the engine can load, NAME being what clients send as `model`
 * and PATH what the engine reads (a GGUF for llama-cpp; a path or hub id the engine server loads).
 */
export function parseLoraFlag(value: string): AdapterSource {
  const eq = value.indexOf('=');
  const name = eq < 0 ? '' : value.slice(0, eq);
  const path = eq < 0 ? '' : value.slice(eq + 1);
  if (!isAdapterName(name) || path === '') throw new InvalidArgumentError(`"${value}" is not NAME=PATH (NAME: letters, digits, . _ : @ -; at most 128)`);
  return { name, path };
}

/** commander's collector for a repeatable --lora: each adapter once by name. */
export function collectLoraFlag(value: string, previous: AdapterSource[] = []): AdapterSource[] {
  const source = parseLoraFlag(value);
  if (previous.some((s) => s.name === source.name)) throw new InvalidArgumentError(`adapter "${source.name}" is named by two --lora flags`);
  return [...previous, source];
}

/** The repeatable --lora option, one for every engine that loads adapters from a path. */
export function loraOption(): Option {
  return new Option('--lora <name=path>', 'a LoRA adapter the engine can load, clients naming it as their `model` (repeatable; llama-cpp: a GGUF for the model; --engine openai: vLLM or SGLang load it through their runtime endpoints)')
    .argParser(collectLoraFlag)
    .default([] as AdapterSource[], 'none');
}
