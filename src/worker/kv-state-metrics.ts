import { Counter, Gauge, type Registry } from 'prom-client';
import type { Engine } from '../engine/engine.js';
import type { KvPullOutcome } from './kv-state-wire.js';

/**
 * Real KV state on this worker: the bytes of state files it holds (bounded by the engine), and
 * each pull of a peer's state by how it ended. Returns the pull counter's recorder.
 */
export function registerKvStateMetrics(registry: Registry, engine: Engine): (outcome: KvPullOutcome) => void {
  new Gauge({
    name: 'ebb_kv_state_bytes',
    help: 'Bytes of KV state files this worker holds on disk (exported for peers, or pulled and not yet loaded)',
    registers: [registry],
    collect() {
      const bytes = engine.stats().kv_state_bytes;
      this.set(typeof bytes === 'number' ? bytes : 0);
    },
  });
  const pulls = new Counter({
    name: 'ebb_kv_state_pulls_total',
    help: "Pulls of a peer's KV state, by outcome: pulled, refused (another model, context, size or hash), unavailable (gone or unreachable; the prompt is evaluated here)",
    labelNames: ['outcome'],
    registers: [registry],
  });
  for (const outcome of ['pulled', 'refused', 'unavailable']) pulls.inc({ outcome }, 0);
  return (outcome) => pulls.inc({ outcome });
}
