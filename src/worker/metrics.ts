import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { collectProcessMetrics } from '../common/process-metrics.js';
import type { Admission } from '../lifecycle/admission.js';
import type { Lifecycle, Transition } from '../lifecycle/lifecycle.js';
import type { RefusalCode, ReleaseOutcome } from '../lifecycle/admission.js';
import { TRANSITIONS, WORKER_STATES } from '../lifecycle/states.js';
import type { StageName, StageOutcome } from './shutdown-stages.js';
import type { Engine } from '../engine/engine.js';
import { kvCacheStatus } from './kv-cache-status.js';
import { registerPickerMetrics } from './picker-metrics.js';

// The label values, each list checked against its type: a value added to the type must be added here.
const RELEASE_OUTCOMES = { completed: 0, errored: 0, dropped: 0, handed_off: 0 } satisfies Record<ReleaseOutcome, 0>;
const REFUSAL_CODES = { worker_draining: 0, worker_overloaded: 0 } satisfies Record<RefusalCode, 0>;
const STAGE_NAMES = { unregister: 0, grace: 0, wait_inflight: 0, handoff: 0, cut_inflight: 0, cleanup: 0 } satisfies Record<StageName, 0>;
const STAGE_OUTCOMES = { completed: 0, timed_out: 0, skipped: 0, cancelled: 0, unsupported: 0 } satisfies Record<StageOutcome, 0>;
const keys = <T extends string>(o: Record<T, 0>): T[] => Object.keys(o) as T[];

/**
 * Worker metrics. Overload and drain are kept apart on purpose: a refusal counter labelled by code,
 * the lifecycle state gauge for drain, and engine queue depth for overload.
 */
export function createWorkerMetrics(admission: Admission, lifecycle: Lifecycle, engine: Engine, model: string) {
  const registry = new Registry();
  collectProcessMetrics(registry);
  registerPickerMetrics(registry, model, engine);

  new Gauge({
    name: 'ebb_worker_state',
    help: 'Lifecycle state (1 for the current one)',
    labelNames: ['state'],
    registers: [registry],
    collect() {
      for (const s of WORKER_STATES) this.set({ state: s }, lifecycle.state === s ? 1 : 0);
    },
  });
  new Gauge({
    name: 'ebb_worker_inflight_requests',
    help: 'Admitted requests whose response has not ended',
    registers: [registry],
    collect() {
      this.set(admission.inflight);
    },
  });
  new Gauge({
    name: 'ebb_worker_admission_open',
    help: '1 while the worker admits new requests',
    registers: [registry],
    collect() {
      this.set(admission.open ? 1 : 0);
    },
  });
  new Gauge({
    name: 'ebb_engine_running_sequences',
    help: 'Sequences in the engine batch',
    registers: [registry],
    collect() {
      this.set(engine.stats().running_sequences);
    },
  });
  new Gauge({
    name: 'ebb_engine_queued_sequences',
    help: 'Sequences waiting for a batch slot (overload, not drain)',
    registers: [registry],
    collect() {
      this.set(engine.stats().queued_sequences);
    },
  });
  const admitted = new Counter({ name: 'ebb_worker_admitted_total', help: 'Requests admitted', registers: [registry] });
  const released = new Counter({ name: 'ebb_worker_requests_total', help: 'Admitted requests by how they ended', labelNames: ['outcome'], registers: [registry] });
  const refused = new Counter({ name: 'ebb_worker_admission_refusals_total', help: 'Requests refused before any work, by code', labelNames: ['code'], registers: [registry] });
  const embeddings = new Counter({ name: 'ebb_worker_embedding_requests_total', help: 'Embedding requests answered (POST /embed)', registers: [registry] });
  const embeddedInputs = new Counter({ name: 'ebb_worker_embedding_inputs_total', help: 'Inputs embedded: one vector each', registers: [registry] });
  const handoffs = new Counter({ name: 'ebb_worker_handoffs_total', help: 'Streams handed off to other workers at a drain deadline', registers: [registry] });
  const preemptions = new Counter({ name: 'ebb_worker_preemptions_total', help: 'Flex streams paused for a priority request that found no free batch slot (their frontend continues them)', registers: [registry] });
  const transitions = new Counter({ name: 'ebb_worker_transitions_total', help: 'Lifecycle transitions', labelNames: ['from', 'to'], registers: [registry] });
  const drainSeconds = new Histogram({
    name: 'ebb_worker_drain_duration_seconds',
    help: 'From drain to drained',
    buckets: [0.01, 0.1, 0.5, 1, 5, 15, 30, 60, 300, 900],
    registers: [registry],
  });
  const shutdownStage = new Histogram({
    name: 'ebb_worker_shutdown_stage_seconds',
    help: 'SIGTERM stages: time spent and how each ended',
    labelNames: ['stage', 'result'],
    buckets: [0.01, 0.1, 0.5, 1, 5, 15, 30, 60],
    registers: [registry],
  });

  // Every series whose label values are known up front exists from the start, at 0: an alert on a
  // refusal, a transition or a timed-out shutdown stage reads 0, not "no data", until the first one.
  for (const outcome of keys(RELEASE_OUTCOMES)) released.inc({ outcome }, 0);
  for (const code of keys(REFUSAL_CODES)) refused.inc({ code }, 0);
  for (const [from, events] of Object.entries(TRANSITIONS)) for (const to of new Set(Object.values(events))) if (to !== from) transitions.inc({ from, to }, 0);
  for (const stage of keys(STAGE_NAMES)) for (const result of keys(STAGE_OUTCOMES)) shutdownStage.zero({ stage, result });

  const kv = engine.kvTransfers;
  new Gauge({
    name: 'ebb_kv_pending_transfers',
    help: 'Prefill KV caches held for a decode peer that has not confirmed receipt',
    registers: [registry],
    collect() {
      this.set(kv?.size ?? 0);
    },
  });
  const kvDuration = new Histogram({
    name: 'ebb_kv_transfer_duration_seconds',
    help: 'From prefill done to receipt confirmed by the decode peer',
    buckets: [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30],
    registers: [registry],
  });
  const kvExpired = new Counter({ name: 'ebb_kv_transfers_expired_total', help: 'KV transfers released by TTL before a decode peer took them', registers: [registry] });
  kv?.on('completed', (_t: unknown, seconds: number) => kvDuration.observe(seconds));
  kv?.on('expired', () => kvExpired.inc());

  // The prefix cache: blocks held now, and prompt tokens found cached or computed, as the engine
  // reported them per request (cached_tokens); 0 on a worker whose engine reports none.
  new Gauge({
    name: 'ebb_worker_kv_cached_blocks',
    help: "Blocks held in the engine's prefix cache (pinned by running sequences or not)",
    registers: [registry],
    collect() {
      this.set(kvCacheStatus(engine)?.cached_blocks ?? 0);
    },
  });
  const promptTokens = new Counter({
    name: 'ebb_worker_prompt_tokens_total',
    help: "Prompt tokens of completed generations, by whether the engine found them in its prefix cache (hit) or computed them (miss)",
    labelNames: ['cache'],
    registers: [registry],
  });
  promptTokens.inc({ cache: 'hit' }, 0);
  promptTokens.inc({ cache: 'miss' }, 0);

  admission.on('admitted', () => admitted.inc());
  admission.on('released', (outcome: string) => released.inc({ outcome }));
  let drainStarted = 0;
  lifecycle.on('transition', (t: Transition) => {
    transitions.inc({ from: t.from, to: t.to });
    if (t.to === 'draining') drainStarted = performance.now();
    if (t.to === 'drained') drainSeconds.observe((performance.now() - drainStarted) / 1000);
  });

  return {
    registry,
    refused: (code: string) => refused.inc({ code }),
    handedOff: () => handoffs.inc(),
    preempted: () => preemptions.inc(),
    /** An embedding answered, with its number of inputs. */
    embedded: (inputs: number) => {
      embeddings.inc();
      embeddedInputs.inc(inputs);
    },
    /** A generation's usage: its prompt tokens counted as cache hits and misses, where the engine says. */
    promptTokens: (prompt: number, cached: number | undefined) => {
      if (cached === undefined) return;
      promptTokens.inc({ cache: 'hit' }, cached);
      promptTokens.inc({ cache: 'miss' }, Math.max(0, prompt - cached));
    },
    shutdownStage: (stage: string, result: string, seconds: number) => shutdownStage.observe({ stage, result }, seconds),
  };
}

export type WorkerMetrics = ReturnType<typeof createWorkerMetrics>;
