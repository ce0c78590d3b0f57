import { InvalidArgumentError } from 'commander';
import type { AdapterSource } from '../engine/engine-adapters.js';

/**
 * An adapter's name is what clients send as `model` and what the admin routes carry in their path
 * (/engine/adapters/{name}/drain): letters, digits, `.`, `_`, `-`, not starting with a separator.
 */
const ADAPTER_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;

/** `--lora NAME=PATH`: one adapter available at start. */
export function parseLoraFlag(value: string): AdapterSource {
  const eq = value.indexOf('=');
  if (eq < 0) throw new InvalidArgumentError(`expected NAME=PATH (the adapter's name, then its GGUF file), got "${value}"`);
  const name = value.slice(0, eq).trim();
  const path = value.slice(eq + 1).trim();
  if (!ADAPTER_NAME.test(name)) throw new InvalidArgumentError(`adapter name "${name}" in "${value}": use letters, digits, ".", "_" and "-" (it is the model name clients send)`);
  if (path === '') throw new InvalidArgumentError(`adapter "${name}" has no file: expected NAME=PATH, got "${value}"`);
  return { name, path };
}

/** commander's collector for a repeatable --lora: each adapter once by name. */
export function collectLoraFlag(value: string, previous: AdapterSource[] = []): AdapterSource[] {
  const source = parseLoraFlag(value);
  if (previous.some((s) => s.name === source.name)) throw new InvalidArgumentError(`adapter "${source.name}" is named by two --lora flags`);
  return [...previous, source];
}
