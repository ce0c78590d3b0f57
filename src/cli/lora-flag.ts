import { InvalidArgumentError, Option } from 'commander';
import type { AdapterSource } from '../engine/engine-adapters.js';
import { isAdapterName } from '../protocol/adapters.js';

/**
 * `--lora NAME=PATH`: a LoRA adapter the engine can load, NAME being what clients send as `model`
 * and PATH what the engine reads (a GGUF for llama-cpp; a path or hub id the engine server loads).
 */
export function parseLoraFlag(value: string): AdapterSource {
  const eq = value.indexOf('=');
  if (eq < 0) throw new InvalidArgumentError(`expected NAME=PATH (the adapter's name, then what the engine loads), got "${value}"`);
  const name = value.slice(0, eq).trim();
  const path = value.slice(eq + 1).trim();
  if (!isAdapterName(name)) throw new InvalidArgumentError(`adapter name "${name}" in "${value}": use letters, digits, . _ : @ - (at most 128; it is the model name clients send)`);
  if (path === '') throw new InvalidArgumentError(`adapter "${name}" has no file: expected NAME=PATH, got "${value}"`);
  return { name, path };
}

/** commander's collector for a repeatable --lora: each adapter once by name. */
export function collectLoraFlag(value: string, previous: AdapterSource[] = []): AdapterSource[] {
  const source = parseLoraFlag(value);
  if (previous.some((s) => s.name === source.name)) throw new InvalidArgumentError(`adapter "${source.name}" is named by two --lora flags`);
  return [...previous, source];
}

/** --mocker-lora, repeatable: a name clients may send as `model` (ebb worker and ebb up). */
export function collectAdapterName(value: string, previous: string[]): string[] {
  if (!isAdapterName(value)) throw new InvalidArgumentError(`"${value}" is not an adapter name (letters, digits, . _ : @ -; at most 128)`);
  return [...previous, value];
}

/** The repeatable --lora option, one for every engine that loads adapters from a path. */
export function loraOption(): Option {
  return new Option('--lora <name=path>', 'a LoRA adapter the engine can load, clients naming it as their `model` (repeatable; llama-cpp: a GGUF for the model; --engine openai: vLLM or SGLang load it through their runtime endpoints)')
    .argParser(collectLoraFlag)
    .default([] as AdapterSource[], 'none');
}
