/**
 * The annotations ebb reads and writes on a worker's Pod. The drain ones are the operator's
 * intent (written by `ebb rollout --k8s-selector`, kubectl or any controller); the state ones are
 * the worker's report, written back by the worker itself.
 */

export const DRAIN = 'ebb.dev/drain';
export const DRAIN_REASON = 'ebb.dev/drain-reason';
export const DRAIN_DEADLINE_MS = 'ebb.dev/drain-deadline-ms';

export const STATE = 'ebb.dev/state';
export const STATE_SINCE = 'ebb.dev/state-since';
/** The worker's lifecycle generation (bumped by every drain and resume): a scale-down deletes a pod only at the one it saw drained. */
export const GENERATION = 'ebb.dev/generation';
/** The deletion cost the pod had before ebb lowered it ("" when it had none), restored on serving. */
export const PREVIOUS_DELETION_COST = 'ebb.dev/previous-deletion-cost';

/** Read by the ReplicaSet controller on scale-down: lower cost is deleted first (an int32 as a string). */
export const POD_DELETION_COST = 'controller.kubernetes.io/pod-deletion-cost';
/** What a drained pod's deletion cost is set to: the lowest int32, so it goes before any other. */
export const DRAINED_DELETION_COST = String(-(2 ** 31));

export type Annotations = Record<string, string>;

export interface DrainIntent {
  reason: string;
  deadlineMs: number | undefined;
}

/**
 * The drain the annotations ask for, or null. Only the exact value "true" counts (as kubectl users
 * write it); a malformed deadline is ignored rather than blocking the drain itself.
 */
export function drainIntentOf(annotations: Annotations | undefined, where: string): DrainIntent | null {
  if (annotations?.[DRAIN] !== 'true') return null;
  const given = annotations[DRAIN_REASON]?.trim();
  const reason = `annotation ${DRAIN} on pod ${where}${given ? `: ${given}` : ''}`;
  const raw = annotations[DRAIN_DEADLINE_MS];
  const n = raw === undefined ? NaN : Number(raw);
  return { reason, deadlineMs: Number.isInteger(n) && n >= 0 ? n : undefined };
}
