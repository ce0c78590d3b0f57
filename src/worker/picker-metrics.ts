import { Gauge, type Registry } from 'prom-client';
import type { Engine } from '../engine/engine.js';
import { kvCacheStatus } from './kv-cache-status.js';

/**
 * The gauges Kubernetes' Gateway API Inference Extension and llm-d pick a model server by, under
 * vLLM's names and with vLLM's meaning (label `model_name`), so an InferencePool can hold ebb
 * workers. The names carry ':' as vLLM's do; promtool's lint flags that, on these names only.
 */
export function registerPickerMetrics(registry: Registry, model: string, engine: Engine): void {
  const labels = { model_name: model };
  new Gauge({
    name: 'vllm:num_requests_running',
    help: 'Number of requests in model execution batches (ebb: sequences in the engine batch)',
    labelNames: ['model_name'],
    registers: [registry],
    collect() {
      this.set(labels, engine.stats().running_sequences);
    },
  });
  new Gauge({
    name: 'vllm:num_requests_waiting',
    help: 'Number of requests waiting to be processed (ebb: admitted, waiting for a batch slot)',
    labelNames: ['model_name'],
    registers: [registry],
    collect() {
      this.set(labels, engine.stats().queued_sequences);
    },
  });
  // vLLM counts a block in use while a running request holds it; cached blocks nothing pins are
  // free to it. Only an engine that says both its capacity and its pinned blocks can say that.
  const kv = kvCacheStatus(engine);
  if (kv?.capacity_blocks == null || kv.pinned_blocks === undefined) return;
  new Gauge({
    name: 'vllm:kv_cache_usage_perc',
    help: 'KV-cache usage: the fraction of KV blocks held by running requests, 1 means 100 percent',
    labelNames: ['model_name'],
    registers: [registry],
    collect() {
      const now = kvCacheStatus(engine);
      this.set(labels, now?.capacity_blocks ? (now.pinned_blocks ?? 0) / now.capacity_blocks : 0);
    },
  });
}
