import type { Logger } from 'pino';
import { formatDuration } from '../common/format-duration.js';
import { DRAIN, DRAIN_DEADLINE_MS, DRAIN_REASON, DRAINED_DELETION_COST, POD_DELETION_COST, PREVIOUS_DELETION_COST, STATE } from './annotations.js';
import { KubeError, type DeploymentScaleApi, type PodApi, type V1Pod } from './client.js';
import { K8sError } from './k8s-error.js';
import { annotationsOf, patchAnnotations, updateAnnotations } from './pod-patcher.js';
import { PodWatcher } from './pod-watcher.js';

export interface K8sScaleDownOptions {
  namespace: string;
  selector: string;
  /** The pods to remove, already chosen (see frontend/admin/victim-ranking). */
  victims: string[];
  /** Bound on the drains: past it every victim is un-annotated (resumes) and nothing is deleted. */
  timeoutMs: number;
  drainDeadlineMs?: number | undefined;
  reason: string;
  /** Scale this Deployment down by the number of victims instead of deleting them. */
  scale?: { api: DeploymentScaleApi; deployment: string } | undefined;
  say: (line: string) => void;
}

export type K8sScaleDownResult = { action: 'deleted' } | { action: 'scaled'; deployment: string; from: number; to: number };

const nameOf = (p: V1Pod): string => p.metadata?.name ?? '';
const stateOf = (p: V1Pod): string | undefined => annotationsOf(p)[STATE];
const terminating = (p: V1Pod): boolean => p.metadata?.deletionTimestamp != null;

/** The pods of `selector` in rotation: reporting ebb.dev/state=serving and not being deleted. */
export async function servingPods(api: PodApi, namespace: string, selector: string): Promise<V1Pod[]> {
  let list;
  try {
    list = await api.list(namespace, { labelSelector: selector });
  } catch (err) {
    throw new K8sError(`cannot list pods ${selector} in ${namespace} at ${api.server}: ${(err as Error).message}`);
  }
  return list.items.filter((p) => !terminating(p) && stateOf(p) === 'serving').sort((a, b) => nameOf(a).localeCompare(nameOf(b)));
}

/** Attempts at the scale read-modify-write before a run of 409 Conflicts is a failure. */
const SCALE_ATTEMPTS = 5;

/**
 * Drain-wait-delete of chosen pods, all or nothing: annotate each for drain, follow the pods (one
 * list+watch; the annotations are the workers' own report) until every one reports drained, then
 * delete them, or leave them at the lowest deletion cost and scale their Deployment down by as
 * many, so its ReplicaSet removes exactly these. A victim that does not drain in time (or goes
 * away) un-annotates every victim, which resumes them, and nothing is deleted or scaled.
 */
export async function k8sScaleDown(api: PodApi, opts: K8sScaleDownOptions, log: Logger): Promise<K8sScaleDownResult> {
  const { say } = opts;
  const watcher = new PodWatcher(api, { namespace: opts.namespace, labelSelector: opts.selector }, log);
  try {
    await watcher.start();
  } catch (err) {
    throw new K8sError(`cannot watch pods ${opts.selector} in ${opts.namespace} at ${api.server}: ${(err as Error).message}`);
  }
  const ref = (name: string) => ({ namespace: opts.namespace, name });
  try {
    for (const name of opts.victims) {
      const p = watcher.pods.get(name);
      if (p === undefined || terminating(p) || stateOf(p) !== 'serving') throw new K8sError(`pod ${name} is no longer serving (ebb.dev/state=${p ? stateOf(p) ?? 'none' : 'gone'}); nothing was changed`);
    }
    for (const name of opts.victims) {
      say(`${name}: draining`);
      // Strategic merge, as `kubectl annotate` sends it: only these keys change.
      await patchAnnotations(api, ref(name), { [DRAIN]: 'true', [DRAIN_REASON]: opts.reason, [DRAIN_DEADLINE_MS]: opts.drainDeadlineMs === undefined ? null : String(opts.drainDeadlineMs) }, 'strategic-merge');
    }
    const t0 = Date.now();
    const pending = new Set(opts.victims);
    try {
      await new Promise<void>((resolve, reject) => {
        const check = () => {
          for (const name of pending) {
            const p = watcher.pods.get(name);
            if (p === undefined || terminating(p)) return finish(new K8sError(`pod ${name} went away while draining`));
            if (stateOf(p) !== 'drained') continue;
            pending.delete(name);
            say(`  ${name}: drained in ${formatDuration(Date.now() - t0)}`);
          }
          if (pending.size === 0) finish();
        };
        const timer = setTimeout(() => {
          const stuck = [...pending].map((n) => `${n} (ebb.dev/state=${stateOf(watcher.pods.get(n) ?? {}) ?? 'none'})`);
          finish(new K8sError(`pod(s) ${stuck.join(', ')} did not drain within ${formatDuration(opts.timeoutMs)}`, 'timed_out'));
        }, opts.timeoutMs);
        const finish = (err?: K8sError) => {
          clearTimeout(timer);
          for (const e of ['pod', 'deleted', 'relisted']) watcher.off(e, check);
          if (err) reject(err);
          else resolve();
        };
        for (const e of ['pod', 'deleted', 'relisted']) watcher.on(e, check);
        check();
      });
    } catch (err) {
      const undrain = { [DRAIN]: null, [DRAIN_REASON]: null, [DRAIN_DEADLINE_MS]: null };
      const failed: string[] = [];
      for (const name of opts.victims) await patchAnnotations(api, ref(name), undrain, 'strategic-merge').catch(() => failed.push(name));
      const after = failed.length === 0 ? 'every victim was un-annotated (resumes) and nothing was deleted' : `could not un-annotate ${failed.join(', ')} (remove ebb.dev/drain by hand); nothing was deleted`;
      throw new K8sError(`scale-down rolled back: ${(err as Error).message}; ${after}`, err instanceof K8sError ? err.kind : 'failed');
    }

    if (opts.scale === undefined) {
      for (const name of opts.victims) {
        await api.delete(ref(name));
        say(`  ${name}: deleted`);
      }
      return { action: 'deleted' };
    }
    // The worker lowers its own pod's cost once drained; an older worker may not: set it here too.
    for (const name of opts.victims)
      await updateAnnotations(
        api,
        ref(name),
        (a) => (a[POD_DELETION_COST] === DRAINED_DELETION_COST ? null : { [POD_DELETION_COST]: DRAINED_DELETION_COST, ...(a[PREVIOUS_DELETION_COST] === undefined ? { [PREVIOUS_DELETION_COST]: a[POD_DELETION_COST] ?? '' } : {}) }),
        log,
      );
    const deployment = ref(opts.scale.deployment);
    for (let attempt = 1; ; attempt++) {
      const { replicas, resourceVersion } = await opts.scale.api.get(deployment);
      const to = Math.max(0, replicas - opts.victims.length);
      try {
        await opts.scale.api.set(deployment, to, resourceVersion);
        say(`deployment/${opts.scale.deployment}: ${replicas} -> ${to} replicas; the drained pods have the lowest deletion cost, so its ReplicaSet removes them`);
        return { action: 'scaled', deployment: opts.scale.deployment, from: replicas, to };
      } catch (err) {
        if (!(err instanceof KubeError && err.code === 409) || attempt >= SCALE_ATTEMPTS) throw new K8sError(`the victims are drained but deployment/${opts.scale.deployment} could not be scaled: ${(err as Error).message}`);
      }
    }
  } finally {
    await watcher.close();
  }
}
