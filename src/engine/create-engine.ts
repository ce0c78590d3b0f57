import type { Logger } from 'pino';
import type { WorkerMode } from '../discovery/discovery.js';
import type { Engine } from './engine.js';
import type { LlamaCppOptions } from './llama-cpp-options.js';
import { MockerEngine, type MockerOptions } from './mocker.js';
import type { OpenAIEngineOptions } from './openai-engine.js';

/**
 * Which engine a worker hosts, and its settings. Each engine kind adds its own variant; the
 * worker only ever sees the Engine contract.
 */
export type EngineSpec =
  | { kind: 'mocker'; options: Omit<MockerOptions, 'mode'> }
  | { kind: 'openai'; options: OpenAIEngineOptions }
  | { kind: 'llama-cpp'; options: LlamaCppOptions };

/**
 * Builds the engine and resolves once it can serve (a real engine loads its model first). The
 * worker does not register before this resolves; `signal` aborts a load cut short by SIGTERM.
 */
export async function createEngine(spec: EngineSpec, mode: WorkerMode, log: Logger, signal: AbortSignal): Promise<Engine> {
  switch (spec.kind) {
    case 'mocker': {
      const engine = new MockerEngine({ ...spec.options, mode });
      await engine.load(signal);
      return engine;
    }
    case 'openai':
      // Loaded only for this engine: it brings undici and the engine's HTTP clients.
      return (await import('./openai-engine.js')).createOpenAIEngine(spec.options, mode, log, signal);
    case 'llama-cpp': {
      // Loaded on demand: a mocker worker never pays for the native bindings.
      const { loadLlamaCppEngine } = await import('./llama-cpp.js');
      return loadLlamaCppEngine(spec.options, log, signal);
    }
  }
}
