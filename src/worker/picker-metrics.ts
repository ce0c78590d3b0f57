import { Gauge, type Registry } from 'prom-client';
import type { Engine, SchedulerGauges } from '../engine/engine.js';
import { kvCacheStatus } from './kv-cache-status.js';

/**
 * The gauges Kubernetes' Gateway API Inference Extension and llm-d pick a model server by, under
 * vLLM's names and with vLLM's meaning (label `model_name`), so an InferencePool can hold ebb
 * workers. The names carry ':' as vLLM's do; promtool's lint flags that, on these names only.
 *
 * In front of an engine server that reports them (vLLM, SGLang, llama-server), its own figures,
 * read once per scrape; otherwise the engine's stats: sequences in its batch, and those admitted
 * that wait for a slot.
 */
export function registerPickerMetrics(registry: Registry, model: string, engine: Engine): void {
  const labels = { model_name: model };
  // The three gauges are collected together within one scrape: one read of the engine server's page.
  let current: { at: number; value: Promise<SchedulerGauges | undefined> } | undefined;
  const server = (): Promise<SchedulerGauges | undefined> => {
    if (engine.schedulerGauges === undefined) return Promise.resolve(undefined);
    if (current === undefined || performance.now() - current.at > 500) current = { at: performance.now(), value: engine.schedulerGauges() };
    return current.value;
  };
  new Gauge({
    name: 'vllm:num_requests_running',
    help: 'Number of requests in model execution batches',
    labelNames: ['model_name'],
    registers: [registry],
    async collect() {
      this.set(labels, (await server())?.running ?? engine.stats().running_sequences);
    },
  });
  new Gauge({
    name: 'vllm:num_requests_waiting',
    help: 'Number of requests waiting to be processed',
    labelNames: ['model_name'],
    registers: [registry],
    async collect() {
      this.set(labels, (await server())?.waiting ?? engine.stats().queued_sequences);
    },
  });
  // vLLM counts a block in use while a running request holds it; cached blocks nothing pins are
  // free to it. An engine of ebb's says that when it reports its capacity and its pinned blocks.
  const kv = kvCacheStatus(engine);
  const own = kv?.capacity_blocks != null && kv.pinned_blocks !== undefined;
  if (!own && engine.schedulerGauges === undefined) return;
  new Gauge({
    name: 'vllm:kv_cache_usage_perc',
    help: 'KV-cache usage: the fraction of KV blocks held by running requests, 1 means 100 percent',
    labelNames: ['model_name'],
    registers: [registry],
    async collect() {
      this.reset();
      if (own) {
        const now = kvCacheStatus(engine);
        this.set(labels, now?.capacity_blocks ? (now.pinned_blocks ?? 0) / now.capacity_blocks : 0);
        return;
      }
      // A server page without it (or unreadable now): no sample rather than a made-up one.
      const usage = (await server())?.kv_cache_usage;
      if (usage !== undefined) this.set(labels, usage);
    },
  });
}
