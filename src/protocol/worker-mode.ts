/**
 * How a worker serves, as its discovery record, its request plane and its engine see it:
 * aggregated (prefill and decode in one), or one half of disaggregated serving.
 */
export const WORKER_MODES = ['aggregated', 'prefill', 'decode'] as const;
export type WorkerMode = (typeof WORKER_MODES)[number];

export function isWorkerMode(v: unknown): v is WorkerMode {
  return (WORKER_MODES as readonly unknown[]).includes(v);
}
