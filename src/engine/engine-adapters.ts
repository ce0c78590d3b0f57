/**
 * LoRA adapters an engine applies over its base model (issue 37). The worker owns each adapter's
 * lifecycle (loading -> serving -> draining -> unloaded, its in-flight count, LRU eviction of idle
 * ones); the engine only loads, unloads and applies, and says what is resident.
 */

/** An adapter the engine can load: its name (what clients send as `model`) and where the engine reads it. */
export interface AdapterSource {
  name: string;
  /** llama-cpp: the adapter GGUF's path; openai engines: the path or id the engine server loads; mocker: absent. */
  path?: string | undefined;
}

export interface EngineAdapters {
  /** Adapters resident at once, at most: loading past it needs the worker to unload an idle one first. */
  readonly maxResident: number;
  /** The adapters this engine can load: those named at start (--lora, --mocker-lora) and those added by an admin load. */
  available(): AdapterSource[];
  /**
   * Makes the adapter resident; resolves once a generate naming it applies it. Aborting `signal`
   * abandons the load (nothing stays resident). Only called by the worker, with a free slot.
   */
  load(source: AdapterSource, signal: AbortSignal): Promise<void>;
  /** Frees its slot. Only called by the worker once no request for it is in flight or being admitted. */
  unload(name: string): Promise<void>;
  /** Names resident now, as the engine itself reports them (openai engines read them back from the server). */
  resident(): Promise<string[]>;
}
