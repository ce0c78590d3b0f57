import type { Static } from 'typebox';
import { Type } from './schema.js';
import { WORKER_MODES } from './worker-mode.js';
import type { AdapterStatus } from './adapters.js';

/**
 * The Admin API's wire types, shared by the worker's system-status server, the frontend's admin
 * listener and the CLI. The lifecycle's own table lives in lifecycle/states.ts; this is what it
 * looks like from outside.
 */

/**
 * `loading`: not yet in discovery (the engine loads, the first registration is under way).
 * `failed`: the engine died under the worker; it leaves discovery, ends what ran with an error, and exits.
 */
export const WORKER_STATES = ['loading', 'serving', 'draining', 'drained', 'stopping', 'failed', 'stopped'] as const;
export type WorkerState = (typeof WORKER_STATES)[number];

/**
 * A drain may say why (kept in status as drain_reason; the start of an audit trail) and give a
 * deadline: past it, streams still running are handed off to other workers, so the drain takes
 * about that long whatever the stream lengths. Without one it waits for completion.
 */
export const DrainBodySchema = Type.Object(
  {
    reason: Type.Optional(Type.String({ maxLength: 500 })),
    deadline_ms: Type.Optional(Type.Integer({ minimum: 0, maximum: 7 * 24 * 3600 * 1000 })),
    /** false: the drain ends with this worker process (no drain intent kept in discovery); `ebb rollout` sends it. */
    persist: Type.Optional(Type.Boolean()),
  },
  { additionalProperties: false },
);
export type DrainBody = Static<typeof DrainBodySchema>;

export const EmptyBodySchema = Type.Object({}, { additionalProperties: false });

/** Whether discovery lists this worker; `unknown` while a change could not be confirmed (discovery down). */
export type DiscoveryPresence = 'registered' | 'unregistered' | 'unknown';

/** GET /engine/status, and the answer of drain and resume. */
export interface WorkerStatus {
  worker_id: string;
  state: WorkerState;
  inflight_requests: number;
  /** Bumped by every drain and resume: a waiter pins the one it started. */
  generation: number;
  admission_open: boolean;
  /** True only when discovery confirmed the registration; `discovery` says more. */
  discovery_registered: boolean;
  discovery: DiscoveryPresence;
  shutting_down: boolean;
  /** What a drain still waits for; empty unless draining or stopping. */
  waiting_for: string[];
  drain_reason: string | null;
  /** When streams still running are handed off to other workers (drain deadline or SIGTERM's); null without one. */
  drain_deadline: string | null;
  /** Streams this drain handed off at its deadline. */
  handed_off: number;
  /**
   * While draining or stopping: the estimated ms until the wait ends (in-flight tokens still to
   * generate times the observed per-token time, plus queued work; capped by the hand-off deadline).
   * Null when unknown (no estimate, or an engine that cannot tell its idleness) or nothing is waited for.
   */
  eta_ms?: number | null;
  /** The drain ETA it would have if drained now (serving too: 0 when idle); null when unknown. What a scale-down ranks by. */
  eta_if_drained_ms?: number | null;
  /** When the worker process started (a scale-down takes the youngest first among equals). */
  started_at?: string;
  /** Its engine is full (queue or KV past its limit): it refuses new requests with worker_overloaded. Frontends hold it out until it says false. */
  overloaded?: boolean;
  /** Batch slots free now (its engine's, less its admitted requests). */
  free_slots?: number;
  /** Batch slots flex requests leave free (--priority-reserve-slots). */
  priority_reserve_slots?: number;
  /** Would a flex request be admitted now (a free slot beyond the reserve)? Frontends give queued flex a turn on it. */
  flex_room?: boolean;
  /**
   * Every live frontend routes to it (each marks it in discovery) and it serves, registered: what
   * GET /ready answers 200 for, and what `ebb rollout` waits for before the next worker.
   */
  routed?: boolean;
  /** How many frontends mark it, of `frontends` live ones. */
  routed_by?: number;
  frontends?: number;
  state_since: string;
  last_error: string | null;
  engine?: Record<string, unknown>;
  /** The engine's LoRA adapters, where it has any: each one's state and in-flight. */
  adapters?: AdapterStatus[];
}

/** POST /models/{model}/scale-down on the frontend's admin listener. */
export const ScaleDownBodySchema = Type.Object(
  {
    count: Type.Integer({ minimum: 1, maximum: 10_000 }),
    /** Hand streams still running after this long off to the workers that stay. */
    deadline_ms: Type.Optional(Type.Integer({ minimum: 0, maximum: 7 * 24 * 3600 * 1000 })),
    /** The pool (prefill, decode) when the model has several. */
    pool: Type.Optional(Type.Union(WORKER_MODES.map((m) => Type.Literal(m)))),
    /** Only answer the ranking and the victims it would take. */
    dry_run: Type.Optional(Type.Boolean()),
    /** Drain exactly these (a dry run's victims; `count` of them); refused if one is no longer serving. */
    workers: Type.Optional(Type.Array(Type.String({ minLength: 1, maxLength: 256 }), { minItems: 1, maxItems: 10_000, uniqueItems: true })),
  },
  { additionalProperties: false },
);
export type ScaleDownBody = Static<typeof ScaleDownBodySchema>;

/** POST /models/{model}/scale-down/report: a scale-down run without this frontend's route, so that its counter counts it. */
export const ScaleDownReportBodySchema = Type.Object(
  {
    by: Type.Literal('k8s'),
    outcome: Type.Union([Type.Literal('started'), Type.Literal('refused'), Type.Literal('dry_run')]),
  },
  { additionalProperties: false },
);
export type ScaleDownReportBody = Static<typeof ScaleDownReportBodySchema>;
