import type { Logger } from 'pino';
import type { AdmissionRequest, Verdict } from './admission-review.js';
import { DRAIN, DRAIN_DEADLINE_MS, DRAIN_REASON, STATE } from './annotations.js';
import { KubeError, podLabel, type PodApi, type PodRef, type V1Pod } from './client.js';
import { annotationsOf, updateAnnotations } from './pod-patcher.js';

/**
 * The eviction guard's decision, for one `pods/eviction` CREATE (what `kubectl drain` and the
 * cluster autoscaler send): an ebb worker that still has work is not evicted; it is annotated for
 * drain instead (the same ebb.dev/drain its self-pod controller follows) and the eviction refused
 * with 429, which `kubectl drain` retries every few seconds. Once the pod reports
 * ebb.dev/state=drained the next attempt is allowed, so the node drain completes with nothing lost.
 *
 * An ebb worker pod is one whose worker reports its state on it (ebb.dev/state, written by
 * `ebb worker --k8s-self-pod`); a pod without it has no worker that could drain on an annotation.
 */

export interface EvictionGuardOptions {
  /** Written as ebb.dev/drain-deadline-ms: streams still running then are handed off, so a drain cannot hold a node forever. */
  drainDeadlineMs?: number | undefined;
  /** Bound on one review's API calls together (read, then annotate); the webhook's timeoutSeconds must leave room above it. */
  apiTimeoutMs: number;
}

/** States with nothing in flight to lose: drained, or no process serving (still loading, failed, exited). */
const EVICTABLE_STATES: ReadonlySet<string> = new Set(['drained', 'loading', 'failed', 'stopped']);

/** Answered so that `kubectl drain` and the cluster autoscaler retry: a 429 is "not yet", not "never". */
const RETRY = { code: 429, reason: 'TooManyRequests' };

const allow: Verdict = { allowed: true };

/** `p`, or a KubeError once `until` (epoch ms) has passed. */
function within<T>(p: Promise<T>, until: number, what: string): Promise<T> {
  const ms = Math.max(0, until - Date.now());
  let timer: NodeJS.Timeout;
  const limit = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new KubeError(undefined, `${what}: no answer within ${ms} ms`)), ms);
  });
  return Promise.race([p, limit]).finally(() => clearTimeout(timer));
}

/** True when the kubelet reports containers and none of them runs: no process, nothing in flight. */
function nothingRuns(pod: V1Pod): boolean {
  const phase = pod.status?.phase;
  if (phase === 'Pending' || phase === 'Succeeded' || phase === 'Failed') return true;
  const statuses = pod.status?.containerStatuses;
  return statuses !== undefined && statuses.length > 0 && statuses.every((s) => s.state?.running === undefined);
}

export class EvictionGuard {
  constructor(
    private readonly api: PodApi,
    private readonly opts: EvictionGuardOptions,
    private readonly log: Logger,
  ) {}

  /** The verdict on one review; never throws (an API failure is a refusal to retry). */
  async review(req: AdmissionRequest): Promise<Verdict> {
    if (req.operation !== 'CREATE' || req.resource.resource !== 'pods' || req.subResource !== 'eviction' || !req.name || !req.namespace) return allow;
    // sideEffects: NoneOnDryRun: a dry run changes nothing, and is not refused for what it would cause.
    if (req.dryRun === true) return allow;
    // One bound for the whole review, so read + annotate together answer before the API server gives up on us.
    const until = Date.now() + this.opts.apiTimeoutMs;
    const ref: PodRef = { namespace: req.namespace, name: req.name };
    const where = podLabel(ref);
    const who = req.userInfo?.username || 'an unknown user';
    let pod: V1Pod;
    try {
      pod = await within(this.api.get(ref), until, `GET pod ${where}`);
    } catch (err) {
      // The eviction itself answers 404 for a pod that is not there.
      if (err instanceof KubeError && err.code === 404) return allow;
      // Fail closed: without the pod we cannot tell an ebb worker with streams from anything else.
      const message = `eviction of pod ${where} refused for now: the eviction guard cannot read the pod (${(err as Error).message}); retry`;
      this.log.warn({ event: 'eviction_refused', pod: where, requested_by: who, why: 'pod_unreadable', err: (err as Error).message }, message);
      return { allowed: false, ...RETRY, message };
    }
    const state = annotationsOf(pod)[STATE];
    if (state === undefined || pod.metadata?.deletionTimestamp != null || EVICTABLE_STATES.has(state) || nothingRuns(pod)) {
      if (state !== undefined) this.log.info({ event: 'eviction_allowed', pod: where, requested_by: who, state }, `eviction of ebb worker pod ${where} allowed (${state})`);
      return allow;
    }

    // The time makes every write a change, which a worker resumed under a standing annotation needs.
    const reason = `eviction of pod ${where} requested by ${who} at ${new Date().toISOString()}`;
    let annotated = 'already' as 'now' | 'already';
    try {
      await within(
        updateAnnotations(
          this.api,
          ref,
          (current) => {
            // Someone's drain is under way: theirs stands. But a worker resumed through its Admin API
            // under a standing annotation serves on, and acts on a change of the annotation only:
            // then ours replaces it, which is such a change.
            if (current[DRAIN] === 'true' && current[STATE] !== 'serving') return null;
            annotated = 'now';
            return { [DRAIN]: 'true', [DRAIN_REASON]: reason, [DRAIN_DEADLINE_MS]: this.opts.drainDeadlineMs === undefined ? null : String(this.opts.drainDeadlineMs) };
          },
          this.log,
        ),
        until,
        `annotating pod ${where}`,
      );
    } catch (err) {
      const message = `eviction of ebb worker pod ${where} (ebb.dev/state=${state}) refused: it must drain first, and annotating it for drain failed (${(err as Error).message}); retry`;
      this.log.warn({ event: 'eviction_refused', pod: where, requested_by: who, state, why: 'annotate_failed', err: (err as Error).message }, message);
      return { allowed: false, ...RETRY, message };
    }
    const message =
      `ebb worker pod ${where} is ${state}: eviction refused until it has drained. ` +
      `${annotated === 'now' ? `It is now annotated ${DRAIN}=true (${reason})` : `It is annotated ${DRAIN}=true`}; ` +
      `retry: the eviction is allowed once the pod reports ${STATE}=drained`;
    this.log.info({ event: 'eviction_refused', pod: where, requested_by: who, state, why: 'not_drained', annotated }, message);
    return { allowed: false, ...RETRY, message };
  }
}
