import type { Engine, KvCacheStats } from '../engine/engine.js';

/**
 * The engine's prefix cache as the worker shows it (GET /engine/status `kv_cache`, the cached
 * blocks gauge): the engine's own figures, else what its KV event log holds; undefined for an
 * engine without a cache it can report.
 */
export function kvCacheStatus(engine: Engine): KvCacheStats | undefined {
  if (engine.kvCacheStats) return engine.kvCacheStats();
  const log = engine.kvEvents;
  return log === undefined ? undefined : { block_size: log.blockSize, capacity_blocks: null, cached_blocks: log.size };
}
