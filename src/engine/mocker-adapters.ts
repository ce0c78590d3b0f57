import { setTimeout as sleep } from 'node:timers/promises';
import type { AdapterSource, EngineAdapters } from './engine-adapters.js';

/** The mocker's adapter settings: `--mocker-lora NAME` (repeatable), `--mocker-lora-slots`, `--mocker-lora-load-ms`. */
export interface MockerLoraOptions {
  names: string[];
  slots: number;
  loadMs: number;
}

export const MOCKER_LORA_DEFAULTS: MockerLoraOptions = { names: [], slots: 2, loadMs: 500 };

/**
 * Simulated LoRA adapters: a load takes `loadMs` (abortable) and holds one of `slots`; a generation
 * under an adapter draws other words than the base model's (mocker.ts seeds by the adapter's name).
 * It checks the worker's side of the contract: loading past the slots, or a generation naming an
 * adapter that is not resident, is a bug there, and fails loudly.
 */
export class MockerAdapters implements EngineAdapters {
  private readonly sources = new Map<string, AdapterSource>();
  private readonly loaded = new Set<string>();

  constructor(private readonly opts: MockerLoraOptions) {
    for (const name of opts.names) this.sources.set(name, { name });
  }

  get maxResident(): number {
    return this.opts.slots;
  }

  available(): AdapterSource[] {
    return [...this.sources.values()];
  }

  async load(source: AdapterSource, signal: AbortSignal): Promise<void> {
    if (this.loaded.size >= this.opts.slots) throw new Error(`all ${this.opts.slots} adapter slots are taken (${[...this.loaded].join(', ')})`);
    this.sources.set(source.name, source);
    await sleep(this.opts.loadMs, undefined, { signal });
    this.loaded.add(source.name);
  }

  async unload(name: string): Promise<void> {
    this.loaded.delete(name);
  }

  async resident(): Promise<string[]> {
    return [...this.loaded];
  }

  /** A generation may apply it now. */
  isResident(name: string): boolean {
    return this.loaded.has(name);
  }
}
