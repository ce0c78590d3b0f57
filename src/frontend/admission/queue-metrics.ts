import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import { BoundedLabels } from '../label-bounds.js';

export type ShedReason = 'queue_full' | 'flex_displaced' | 'expected_wait' | 'queue_timeout' | 'no_worker';
const SHED_REASONS = { queue_full: 0, flex_displaced: 0, expected_wait: 0, queue_timeout: 0, no_worker: 0 } satisfies Record<ShedReason, 0>;

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
  const shedModels = new Set<string>();
  const waitSeries = new Set<string>();
  return {
    observe: (q: QueueDepths) => void (queue = q),
    entered: (model: string, tier: string, tenant: string) => {
      // A model's sheds, and its waits by tier and tenant, are there at 0 from its first wait: a
      // rate() over them sees the first shed or wait (a series born with it would hide it).
      if (!shedModels.has(model) && shedModels.size < 1024) {
        shedModels.add(model);
        for (const reason of Object.keys(SHED_REASONS)) sheds.inc({ model, reason }, 0);
      }
      const waits = `${model}\n${tier}\n${tenantLabel(tenant)}`;
      if (!waitSeries.has(waits) && waitSeries.size < 4096) {
        waitSeries.add(waits);
        for (const outcome of ['admitted', 'left', 'shed']) wait.zero({ model, tier, tenant: tenantLabel(tenant), outcome });
      }
      entered.inc({ model, tier });
    },
    left: (model: string, tier: string, tenant: string, seconds: number, outcome: string) => wait.observe({ model, tier, tenant: tenantLabel(tenant), outcome }, seconds),
    shed: (model: string, reason: ShedReason) => sheds.inc({ model, reason }),
  };
}

export type QueueMetrics = ReturnType<typeof createQueueMetrics>;
