import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import { BoundedLabels } from '../label-bounds.js';

export type ShedReason = 'queue_full' | 'flex_displaced' | 'expected_wait' | 'queue_timeout' | 'no_worker';

/** What the gauges read at each scrape: the admission queue's waiters. */
export interface QueueDepths {
  /** [model, class, tenant, waiters] */
  depths(): Iterable<[string, string, string, number]>;
  modelDepths(): Map<string, number>;
}

/**
 * The admission queue on the frontend's /metrics: depth and wait per model, tier and tenant, sheds
 * by reason, and ebb_frontend_fleet_queued_requests{model}, the gauge an autoscaler scales on. Every
 * process of `--processes N` queues its own requests, so the aggregated scrape's sum counts each once.
 */
export function createQueueMetrics(registry: Registry) {
  const tenants = new BoundedLabels();
  const tenantLabel = (tenant: string) => tenants.of(tenant);
  let queue: QueueDepths | undefined;
  new Gauge({
    name: 'ebb_frontend_queue_depth',
    help: 'Requests waiting in the admission queue, by model, tier (continuation, priority, default, flex) and tenant',
    labelNames: ['model', 'tier', 'tenant'],
    registers: [registry],
    collect() {
      this.reset();
      if (queue) for (const [model, tier, tenant, n] of queue.depths()) this.inc({ model, tier, tenant: tenantLabel(tenant) }, n);
    },
  });
  new Gauge({
    name: 'ebb_frontend_fleet_queued_requests',
    help: 'Requests waiting for a worker of the model in the frontends\' admission queues (scale out on it)',
    labelNames: ['model'],
    registers: [registry],
    collect() {
      this.reset();
      if (queue) for (const [model, n] of queue.modelDepths()) this.set({ model }, n);
    },
  });
  const wait = new Histogram({
    name: 'ebb_frontend_queue_wait_seconds',
    help: 'Time requests spent in the admission queue, by model, tier, tenant and how they left (admitted, left, shed)',
    labelNames: ['model', 'tier', 'tenant', 'outcome'],
    buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
    registers: [registry],
  });
  const entered = new Counter({ name: 'ebb_frontend_queue_entered_total', help: 'Requests that entered the admission queue, by model and tier', labelNames: ['model', 'tier'], registers: [registry] });
  const sheds = new Counter({
    name: 'ebb_frontend_queue_sheds_total',
    help: 'Requests the admission queue answered without a worker, by model and reason (queue_full, flex_displaced, expected_wait, queue_timeout: 429; no_worker: 503)',
    labelNames: ['model', 'reason'],
    registers: [registry],
  });
  return {
    observe: (q: QueueDepths) => void (queue = q),
    entered: (model: string, tier: string) => entered.inc({ model, tier }),
    left: (model: string, tier: string, tenant: string, seconds: number, outcome: string) => wait.observe({ model, tier, tenant: tenantLabel(tenant), outcome }, seconds),
    shed: (model: string, reason: ShedReason) => sheds.inc({ model, reason }),
  };
}

export type QueueMetrics = ReturnType<typeof createQueueMetrics>;
