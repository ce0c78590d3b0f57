import type { Dispatcher } from 'undici';
import type { AdapterSource, EngineAdapters } from './engine-adapters.js';
import { getBounded, requestBounded, type BoundedAnswer } from './engine-http.js';
import type { EngineKind } from './openai-engine-options.js';

/** How long an engine server may take to load or unload an adapter (it reads weights from disk or a hub). */
const ADAPTER_CALL_TIMEOUT_MS = 120_000;

/** Where each engine server loads and unloads adapters at run time; the others have no such endpoints. */
const RUNTIME_PATHS: Partial<Record<EngineKind, { load: string; unload: string }>> = {
  vllm: { load: '/v1/load_lora_adapter', unload: '/v1/unload_lora_adapter' },
  sglang: { load: '/load_lora_adapter', unload: '/unload_lora_adapter' },
};

/**
 * `--engine openai` adapters: loads and unloads are forwarded to the engine server's runtime
 * endpoints (vLLM needs VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and --enable-lora; SGLang
 * --enable-lora), and what is resident is read back from its /v1/models, where adapters are listed
 * with a `parent`. `slots` must be the engine's own bound (vLLM --max-loras, SGLang --max-loras-per-batch).
 */
export class OpenAIEngineAdapters implements EngineAdapters {
  private readonly sources = new Map<string, AdapterSource>();
  private readonly paths: { load: string; unload: string };

  constructor(
    kind: EngineKind,
    private readonly baseUrl: string,
    private readonly dispatcher: Dispatcher,
    sources: AdapterSource[],
    readonly maxResident: number,
  ) {
    const paths = RUNTIME_PATHS[kind];
    if (paths === undefined) throw new Error(`--lora needs --engine-kind vllm or sglang: a ${kind} engine server has no runtime adapter endpoints`);
    this.paths = paths;
    for (const s of sources) this.sources.set(s.name, s);
  }

  available(): AdapterSource[] {
    return [...this.sources.values()];
  }

  async load(source: AdapterSource, signal: AbortSignal): Promise<void> {
    this.sources.set(source.name, source);
    const { status, text } = await this.post(this.paths.load, { lora_name: source.name, lora_path: source.path ?? source.name }, signal);
    // Loaded already (by an earlier worker process, or the engine's own --lora-modules): resident, as asked.
    if (status === 200 || (status === 400 && /already (been )?loaded/i.test(text))) return;
    throw new Error(`${this.paths.load} answered ${status}: ${text.slice(0, 300)}`);
  }

  async unload(name: string): Promise<void> {
    const { status, text } = await this.post(this.paths.unload, { lora_name: name });
    // Gone already: what an unload asks for.
    if (status === 200 || status === 404 || (status === 400 && /not (be )?found|cannot be found/i.test(text))) return;
    throw new Error(`${this.paths.unload} answered ${status}: ${text.slice(0, 300)}`);
  }

  async resident(): Promise<string[]> {
    const res = await getBounded(`${this.baseUrl}/v1/models`, this.dispatcher, 5000, 1 << 20);
    if (res.status !== 200) throw new Error(`GET ${this.baseUrl}/v1/models answered ${res.status}`);
    const list = JSON.parse(res.text) as { data?: Array<{ id?: unknown; parent?: unknown }> };
    return (list.data ?? []).filter((m) => typeof m.id === 'string' && typeof m.parent === 'string').map((m) => m.id as string);
  }

  private post(path: string, body: unknown, signal?: AbortSignal): Promise<BoundedAnswer> {
    return requestBounded(`${this.baseUrl}${path}`, this.dispatcher, ADAPTER_CALL_TIMEOUT_MS, { method: 'POST', json: body, maxBytes: 64 * 1024, signal });
  }
}
