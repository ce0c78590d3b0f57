import { Counter, Gauge, Registry } from 'prom-client';
import { HeldCounter, HeldHistogram, type CounterSeries, type HistogramSeries } from '../common/held-series.js';
import { collectProcessMetrics } from '../common/process-metrics.js';
import type { GenerateBody, Usage } from '../protocol/request-plane.js';
import { BoundedLabels } from './label-bounds.js';
import { ModelStats } from './model-stats.js';
import type { RequestOutcome } from './request-outcome.js';
import type { MigrationReason } from './relay/migration.js';
import type { WorkerPool } from './routing/worker-pool.js';

// Label values known up front, each list checked against its type (a value added there must be added here).
const MIGRATION_REASONS = { worker_failed: 0, worker_unresponsive: 0, handoff: 0, preempted: 0 } satisfies Record<MigrationReason, 0>;
export type MigrationFailure = 'no_worker' | 'limit' | 'error' | 'broke_workers';
const MIGRATION_FAILURES = { no_worker: 0, limit: 0, error: 0, broke_workers: 0 } satisfies Record<MigrationFailure, 0>;

/**
 * Frontend metrics. ebb_frontend_upstream_attempts_total is the routing record: which worker each
 * attempt went to and how it ended (routed, worker_draining, worker_overloaded, unreachable, ...).
 */
export function createFrontendMetrics(pool: WorkerPool) {
  const registry = new Registry();
  collectProcessMetrics(registry);
  const requests = new HeldCounter({ name: 'ebb_frontend_requests_total', help: 'Client requests by endpoint and status', labelNames: ['endpoint', 'status'], registers: [registry] });
  const attempts = new HeldCounter({ name: 'ebb_frontend_upstream_attempts_total', help: 'Upstream attempts by worker and outcome', labelNames: ['worker_id', 'outcome'], registers: [registry] });
  const midStream = new Counter({ name: 'ebb_frontend_midstream_failures_total', help: 'Streams cut by a worker failure after tokens reached the client', registers: [registry] });
  const migrations = new Counter({
    name: 'ebb_frontend_migrations_total',
    help: 'Streams continued on another worker, by why the previous one stopped (worker_failed, worker_unresponsive, handoff; preempted: continued after a pause for a priority request, on any worker)',
    labelNames: ['reason'],
    registers: [registry],
  });
  const migrationFailures = new Counter({
    name: 'ebb_frontend_migration_failures_total',
    help: 'Streams that needed another worker and got none, by why (no_worker, limit, error; broke_workers: the second worker lost under it, so it is not sent to a third)',
    labelNames: ['reason'],
    registers: [registry],
  });
  const preemptions = new Counter({ name: 'ebb_frontend_preemptions_total', help: 'Flex streams a worker paused for a priority request (each continued later, or ended with an error saying why)', registers: [registry] });
  // At 0 from the start: an alert on them reads 0, not "no data", until the first event.
  for (const reason of Object.keys(MIGRATION_REASONS)) migrations.inc({ reason }, 0);
  for (const reason of Object.keys(MIGRATION_FAILURES)) migrationFailures.inc({ reason }, 0);
  // What an SRE charts per model and tier (GenAI semantic-convention names where they exist).
  const modelRequests = new HeldCounter({
    name: 'ebb_frontend_model_requests_total',
    help: 'Generation and embedding requests by model (as the client named it: an adapter is its own), tier, tenant (at most 20 named, the rest other) and outcome (ok, invalid, shed, unavailable, error, client_gone)',
    labelNames: ['model', 'tier', 'tenant', 'outcome'],
    registers: [registry],
  });
  const duration = new HeldHistogram({
    name: 'gen_ai_server_request_duration_seconds',
    help: 'End-to-end request duration at the frontend, from its arrival to the last byte of its answer, by model, tier and outcome',
    labelNames: ['model', 'tier', 'outcome'],
    buckets: [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320],
    registers: [registry],
  });
  const ttft = new HeldHistogram({
    name: 'gen_ai_server_time_to_first_token_seconds',
    help: 'From the request to its first token at the frontend (retries and queueing included), streamed or not, by model and tier',
    labelNames: ['model', 'tier'],
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40],
    registers: [registry],
  });
  const tpot = new HeldHistogram({
    name: 'gen_ai_server_time_per_output_token_seconds',
    help: 'Inter-token latency: per request, the time from its first token to its last over the tokens after the first (migrations included), by model and tier',
    labelNames: ['model', 'tier'],
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5],
    registers: [registry],
  });
  const tokens = new HeldCounter({
    name: 'ebb_frontend_tokens_total',
    help: 'Tokens of answered generations by model, tier and type (input: prompt, output: completion); rate() is tokens per second',
    labelNames: ['model', 'tier', 'type'],
    registers: [registry],
  });
  const tenants = new BoundedLabels();
  new Gauge({
    name: 'ebb_frontend_workers',
    help: 'Workers in the routing view, by model and whether the frontend holds them out',
    labelNames: ['model', 'mode', 'hold'],
    registers: [registry],
    // Every process of `--processes N` sees the same fleet: summing them would count each worker N times.
    aggregator: 'max',
    collect() {
      this.reset();
      const now = Date.now();
      for (const w of pool.all()) {
        const hold = w.hold && w.hold.until > now ? w.hold.kind : 'none';
        this.inc({ model: w.record.model, mode: w.record.mode, hold });
      }
    },
  });
  new Gauge({
    name: 'ebb_frontend_worker_inflight_requests',
    help: 'Requests this frontend has on each worker',
    labelNames: ['worker_id'],
    registers: [registry],
    collect() {
      this.reset();
      for (const [id, n] of pool.inflight()) this.set({ worker_id: id }, n);
    },
  });
  // The dashboard's per-model minute (the counters above have no model label: a client names models).
  const stats = new ModelStats();
  // Each request's series, held (held-series.ts): a request finds its (model, tier) once, not a label hash per metric.
  const outcomeSeries = new Map<string, { requests: CounterSeries; duration: HistogramSeries }>();
  const perModel = new Map<string, { ttft: HistogramSeries; tpot: HistogramSeries; input: CounterSeries; output: CounterSeries }>();
  const modelSeries = (model: string, tier: string) => {
    const key = `${model}\u0000${tier}`;
    let s = perModel.get(key);
    if (s === undefined) {
      s = { ttft: ttft.series(model, tier), tpot: tpot.series(model, tier), input: tokens.series(model, tier, 'input'), output: tokens.series(model, tier, 'output') };
      perModel.set(key, s);
    }
    return s;
  };
  return {
    registry,
    stats,
    /**
     * A public API request closed: counted by endpoint and status, and, for one that named a model
     * the fleet knows (`model`; undefined otherwise: a client's typo is no label), by model, tier,
     * tenant and outcome, with its end-to-end duration.
     */
    request: (endpoint: string, status: number, model: string | undefined, labels?: { tier: string; tenant: string; outcome: RequestOutcome; seconds: number }) => {
      requests.series(endpoint, String(status)).inc();
      if (model === undefined) return;
      stats.answered(model, status);
      if (labels === undefined) return;
      const tenant = tenants.of(labels.tenant);
      const outcomeKey = `${model}\u0000${labels.tier}\u0000${tenant}\u0000${labels.outcome}`;
      let s = outcomeSeries.get(outcomeKey);
      if (s === undefined) {
        s = { requests: modelRequests.series(model, labels.tier, tenant, labels.outcome), duration: duration.series(model, labels.tier, labels.outcome) };
        outcomeSeries.set(outcomeKey, s);
      }
      s.requests.inc();
      s.duration.observe(labels.seconds);
    },
    attempt: (workerId: string, outcome: string) => attempts.series(workerId, outcome).inc(),
    midStreamFailure: () => midStream.inc(),
    migrated: (reason: MigrationReason) => migrations.inc({ reason }),
    preempted: () => preemptions.inc(),
    migrationFailed: (reason: MigrationFailure) => migrationFailures.inc({ reason }),
    /** A response's first tokens are here (streamed: they leave now). */
    firstToken: (seconds: number, gen: GenerateBody) => {
      const model = gen.adapter ?? gen.model;
      modelSeries(model, gen.service_tier ?? 'default').ttft.observe(seconds);
      stats.firstToken(model, seconds);
    },
    /**
     * A response's generation ended whole: its tokens, and its inter-token latency over `lanes`
     * sequences from `firstAt` (performance.now() of its first tokens; undefined: this frontend did
     * not see them, a takeover).
     */
    generated: (gen: GenerateBody, usage: Usage, lanes: number, firstAt: number | undefined) => {
      const s = modelSeries(gen.adapter ?? gen.model, gen.service_tier ?? 'default');
      s.input.inc(usage.prompt_tokens);
      s.output.inc(usage.completion_tokens);
      const perLane = usage.completion_tokens / Math.max(1, lanes);
      if (firstAt !== undefined && perLane > 1) s.tpot.observe((performance.now() - firstAt) / 1000 / (perLane - 1));
    },
  };
}

export type FrontendMetrics = ReturnType<typeof createFrontendMetrics>;

/** One model's pool as an autoscaler needs it (see admin/fleet-capacity). */
export interface PoolCapacity {
  model: string;
  mode: string;
  serving: number;
  draining: number;
  inflight: number;
  /** Serving workers that could leave now with nothing to wait for (idle), leaving at least one. */
  drainable: number;
  /** The drain ETA of the worker a scale-down by one would take; null when unknown or none. */
  drainEtaMs: number | null;
}

export type ScaleDownOutcome = 'started' | 'refused' | 'dry_run';
const SCALE_DOWN_OUTCOMES = { started: 0, refused: 0, dry_run: 0 } satisfies Record<ScaleDownOutcome, 0>;
/** What ran a scale-down: this frontend's route, or `ebb scale-down --k8s-selector`, which reports it to its --frontend. */
export type ScaleDownRunner = 'frontend' | 'k8s';
const SCALE_DOWN_RUNNERS = { frontend: 0, k8s: 0 } satisfies Record<ScaleDownRunner, 0>;

/**
 * The fleet's capacity per model and pool, read from the workers' own status at scrape time (one
 * read of the fleet per scrape, shared by the gauges), and the scale-downs asked of this frontend.
 * The gauges are there for every model the fleet view knows, at 0 when it has no serving worker.
 */
export function registerFleetMetrics(registry: Registry, capacity: () => Promise<PoolCapacity[]>) {
  let current: { at: number; value: Promise<PoolCapacity[]> } | undefined;
  const snapshot = (): Promise<PoolCapacity[]> => {
    // The gauges are collected concurrently within one scrape: they share one read.
    if (current === undefined || Date.now() - current.at > 500) current = { at: Date.now(), value: capacity().catch(() => []) };
    return current.value;
  };
  const gauge = (name: string, help: string, value: (c: PoolCapacity) => number) =>
    new Gauge({
      name,
      help,
      labelNames: ['model', 'mode'],
      registers: [registry],
      async collect() {
        const pools = await snapshot();
        this.reset();
        for (const c of pools) this.set({ model: c.model, mode: c.mode }, value(c));
      },
    });
  gauge('ebb_frontend_fleet_serving_workers', 'Workers in rotation, by model and pool (read from the workers at scrape time)', (c) => c.serving);
  gauge('ebb_frontend_fleet_draining_workers', 'Workers draining (out of rotation, finishing their streams), by model and pool', (c) => c.draining);
  gauge('ebb_frontend_fleet_inflight_requests', 'Requests in flight on the workers of a model and pool, as they report them', (c) => c.inflight);
  gauge('ebb_frontend_fleet_drainable_workers', 'Serving workers that could be removed now with nothing to wait for (idle), leaving at least one', (c) => c.drainable);
  gauge('ebb_frontend_fleet_drain_eta_seconds', 'How long a scale-down by one would wait: the drain ETA of its first victim (NaN when unknown)', (c) => (c.drainEtaMs === null ? NaN : c.drainEtaMs / 1000));
  const scaleDowns = new Counter({
    name: 'ebb_frontend_scale_downs_total',
    help: 'Scale-downs by outcome (started, refused, dry_run) and by what ran them: frontend (POST /models/{model}/scale-down, which ebb scale-down --frontend calls), k8s (ebb scale-down --k8s-selector, reported to its --frontend); ebb scale-down --discovery reaches no frontend and is not counted',
    labelNames: ['outcome', 'by'],
    registers: [registry],
  });
  for (const outcome of Object.keys(SCALE_DOWN_OUTCOMES)) for (const by of Object.keys(SCALE_DOWN_RUNNERS)) scaleDowns.inc({ outcome, by }, 0);
  return { scaleDown: (outcome: ScaleDownOutcome, by: ScaleDownRunner = 'frontend') => scaleDowns.inc({ outcome, by }) };
}
