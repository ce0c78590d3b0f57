import { Counter, Gauge, type Registry } from 'prom-client';
import { ADAPTER_STATES } from '../lifecycle/adapter-states.js';
import type { WorkerAdapters } from './adapters.js';

/** The worker's adapter metrics (issue 37), on a worker whose engine has adapters. */
export function registerAdapterMetrics(registry: Registry, adapters: WorkerAdapters): void {
  const loads = new Counter({ name: 'ebb_worker_adapter_loads_total', help: 'LoRA adapter loads started (a request for one not resident, or an admin load), by adapter', labelNames: ['adapter'], registers: [registry] });
  for (const { name } of adapters.status()) loads.inc({ adapter: name }, 0);
  adapters.on('load', (name: string) => loads.inc({ adapter: name }));
  new Gauge({
    name: 'ebb_worker_adapters',
    help: 'LoRA adapters by state (loading, serving and draining ones hold a slot)',
    labelNames: ['state'],
    registers: [registry],
    collect() {
      const n = Object.fromEntries(ADAPTER_STATES.map((s) => [s, 0])) as Record<string, number>;
      for (const a of adapters.inflightByName().values()) n[a.state] = (n[a.state] ?? 0) + 1;
      for (const s of ADAPTER_STATES) this.set({ state: s }, n[s] ?? 0);
    },
  });
  new Gauge({ name: 'ebb_worker_adapter_slots', help: 'LoRA adapters the engine holds resident at once, at most', registers: [registry] }).set(adapters.slots);
  new Gauge({
    name: 'ebb_worker_adapter_inflight_requests',
    help: 'Admitted requests per LoRA adapter whose response has not ended (those waiting for its load included)',
    labelNames: ['adapter'],
    registers: [registry],
    collect() {
      // An adapter dropped from the worker (an admin load of a new name that failed) leaves no series behind.
      this.reset();
      for (const [adapter, a] of adapters.inflightByName()) this.set({ adapter }, a.inflight);
    },
  });
  registerLoraRequestsInfo(registry, adapters);
}

/**
 * vLLM's `vllm:lora_requests_info` (what llm-d's and the Gateway API inference extension's LoRA
 * affinity scorers read): one series, its value the time of the reading, its labels the adapters
 * with requests running and waiting (for their load), comma-separated, and the slot count.
 */
export function registerLoraRequestsInfo(registry: Registry, adapters: WorkerAdapters): void {
  new Gauge({
    name: 'vllm:lora_requests_info',
    help: 'Running stats on lora requests.',
    labelNames: ['running_lora_adapters', 'waiting_lora_adapters', 'max_lora'],
    registers: [registry],
    collect() {
      const running: string[] = [];
      const waiting: string[] = [];
      for (const [name, a] of adapters.inflightByName()) if (a.inflight > 0) (a.state === 'loading' ? waiting : running).push(name);
      this.reset();
      this.set({ running_lora_adapters: running.join(','), waiting_lora_adapters: waiting.join(','), max_lora: String(adapters.slots) }, Date.now() / 1000);
    },
  });
}
