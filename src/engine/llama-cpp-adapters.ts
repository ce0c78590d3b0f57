import { resolve } from 'node:path';
import type { LlamaContext, LlamaModel } from 'node-llama-cpp';
import { EbbError } from '../protocol/errors.js';
import type { AdapterSource, EngineAdapters } from './engine-adapters.js';
import { oneLine } from './llama-cpp-grammar.js';
import type { PrefixSequences } from './llama-cpp-prefix-reuse.js';
import { checkLoraGguf } from './lora-gguf.js';

/** A resident adapter: llama.cpp applies LoRA per context, so each has a context (and KV cache) of its own. */
export interface AdapterContext {
  readonly path: string;
  readonly context: LlamaContext;
  /** Its context's sequences: a prefix is only ever reused under the adapter that computed it. */
  readonly sequences: PrefixSequences;
}

/** Makes the context an adapter runs in (the engine's shape: its sequences, size, threads, batching). */
export type AdapterContextFactory = (path: string, signal: AbortSignal) => Promise<Omit<AdapterContext, 'path'>>;

/** node-llama-cpp 3.21.1's per-model adapter cache (internal): it frees adapter weights only when the model goes. */
type LoraCache = Map<string, { dispose(): Promise<void> }>;

/**
 * The llama-cpp engine's LoRA adapters. llama.cpp applies adapters to a whole context
 * (llama_set_adapters_lora), and node-llama-cpp sets them once, at the context's creation: so a
 * resident adapter is a context of its own, as large as the base one. Requests for different
 * adapters are served at once but never share a decode (each context decodes on its own, sharing
 * the CPU threads); those for one adapter batch together in its context. The worker decides what
 * is resident; this loads, unloads and says.
 */
export class LlamaCppAdapters implements EngineAdapters {
  private readonly sources = new Map<string, AdapterSource>();
  private readonly contexts = new Map<string, AdapterContext>();
  /** Loads under way: they hold their slot already. */
  private readonly loading = new Set<string>();

  constructor(
    private readonly model: LlamaModel,
    private readonly makeContext: AdapterContextFactory,
    initial: readonly AdapterSource[],
    readonly maxResident: number,
  ) {
    for (const s of initial) this.sources.set(s.name, s);
  }

  available(): AdapterSource[] {
    return [...this.sources.values()];
  }

  async resident(): Promise<string[]> {
    return this.residentNames;
  }

  get residentNames(): string[] {
    return [...this.contexts.keys()];
  }

  /** The context a generation for `name` runs in; the worker made it resident first. */
  contextOf(name: string): AdapterContext {
    const ctx = this.contexts.get(name);
    if (ctx === undefined) throw new EbbError('model_not_found', `LoRA adapter "${name}" is not resident in this engine`);
    return ctx;
  }

  async load(source: AdapterSource, signal: AbortSignal): Promise<void> {
    const { name } = source;
    const known = this.sources.get(name)?.path;
    if (known !== undefined && source.path !== undefined && resolve(source.path) !== resolve(known))
      throw new EbbError('invalid_request', `LoRA adapter "${name}" is ${known} already; unload it and load ${source.path} under another name`, { param: 'path' });
    const path = source.path ?? known;
    if (path === undefined) throw new EbbError('not_found', `no LoRA adapter "${name}": none was named by --lora, and a load at run time needs its path`);
    if (this.contexts.has(name)) return;
    if (this.loading.has(name)) throw new EbbError('invalid_request', `LoRA adapter "${name}" is being loaded already`);
    if (this.contexts.size + this.loading.size >= this.maxResident)
      throw new EbbError('adapter_slots_busy', `all ${this.maxResident} LoRA adapter slots are taken (${[...this.contexts.keys(), ...this.loading].join(', ')}): unload one first`);
    this.loading.add(name);
    try {
      await checkLoraGguf(path, this.model.fileInfo).catch((err: unknown) => {
        throw new EbbError('invalid_request', `cannot load LoRA adapter "${name}" from ${path}: ${oneLine(err)}`, { param: 'path' });
      });
      signal.throwIfAborted();
      const made = await this.makeContext(path, signal).catch(async (err: unknown) => {
        await this.releaseWeights(path);
        if (signal.aborted) throw signal.reason;
        throw new EbbError('engine_error', `cannot load LoRA adapter "${name}" from ${path}: ${oneLine(err)}`);
      });
      if (signal.aborted) {
        await made.context.dispose();
        await this.releaseWeights(path);
        throw signal.reason;
      }
      this.contexts.set(name, { path, ...made });
      this.sources.set(name, { name, path });
    } finally {
      this.loading.delete(name);
    }
  }

  async unload(name: string): Promise<void> {
    const ctx = this.contexts.get(name);
    if (ctx === undefined) return;
    this.contexts.delete(name);
    await ctx.context.dispose();
    await this.releaseWeights(ctx.path);
  }

  /**
   * node-llama-cpp keeps an adapter's weights in its model until the model is disposed (the whole
   * worker): an unload frees them through that cache, once no resident adapter reads the file. Its
   * next load reads the file again.
   */
  private async releaseWeights(path: string): Promise<void> {
    const key = resolve(path);
    if ([...this.contexts.values()].some((c) => resolve(c.path) === key)) return;
    const cache = (this.model as unknown as { _loraAdapters?: unknown })._loraAdapters;
    if (!(cache instanceof Map)) return; // another node-llama-cpp: the weights stay until the model goes
    const lora = (cache as LoraCache).get(key);
    if (lora === undefined) return;
    cache.delete(key);
    await lora.dispose();
  }

  async close(): Promise<void> {
    for (const name of this.residentNames) await this.unload(name);
  }
}
