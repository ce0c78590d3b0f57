import type { Logger } from 'pino';
import { formatDuration } from '../common/format-duration.js';
import { DRAIN, DRAIN_DEADLINE_MS, DRAIN_REASON, DRAINED_DELETION_COST, GENERATION, POD_DELETION_COST, PREVIOUS_DELETION_COST, STATE, type Annotations } from './annotations.js';
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

/**
 * The precondition of every destructive step: the pod still reports drained, still annotated for
 * drain, at the generation it was seen drained at (a resume, or a resume and another drain, bumps
 * it). A K8sError saying what changed otherwise.
 */
function assertStillDrained(name: string, a: Annotations, deleting: boolean, drainedAt: string): void {
  if (!deleting && a[STATE] === 'drained' && a[DRAIN] === 'true' && a[GENERATION] === drainedAt) return;
  const now = deleting ? 'being deleted' : `ebb.dev/state=${a[STATE] ?? 'none'}, ebb.dev/drain=${a[DRAIN] ?? 'none'}, generation ${a[GENERATION] ?? 'none'}`;
  throw new K8sError(`pod ${name} changed after it reported drained at generation ${drainedAt} (now ${now}): it was resumed or acted on by someone else`);
}

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
    /** The generation each victim reported drained at: what the destructive steps require. */
    const drainedAt = new Map<string, string>();
    const deleted = new Set<string>();
    const undrain = { [DRAIN]: null, [DRAIN_REASON]: null, [DRAIN_DEADLINE_MS]: null };
    try {
      await new Promise<void>((resolve, reject) => {
        const check = () => {
          for (const name of pending) {
            const p = watcher.pods.get(name);
            if (p === undefined || terminating(p)) return finish(new K8sError(`pod ${name} went away while draining`));
            if (stateOf(p) !== 'drained') continue;
            const generation = annotationsOf(p)[GENERATION];
            if (generation === undefined) return finish(new K8sError(`pod ${name} drained but reports no ${GENERATION} (a worker older than this ebb): delete it by hand if it is to go`));
            drainedAt.set(name, generation);
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
      if (opts.scale === undefined) {
        // Checked for all before the first delete; each delete is of the version checked (409 if it changed since).
        const checked = new Map<string, string | undefined>();
        for (const name of opts.victims) {
          const p = await api.get(ref(name));
          assertStillDrained(name, annotationsOf(p), terminating(p), drainedAt.get(name) as string);
          checked.set(name, p.metadata?.resourceVersion);
        }
        for (const name of opts.victims) {
          try {
            await api.delete(ref(name), checked.get(name));
          } catch (err) {
            if (err instanceof KubeError && err.code === 409) throw new K8sError(`pod ${name} changed between its check and its delete (409 Conflict): it was resumed or acted on by someone else`);
            throw err;
          }
          deleted.add(name);
          say(`  ${name}: deleted`);
        }
        return { action: 'deleted' };
      }
      // The worker lowers its own pod's cost once drained; an older worker may not: set it here too,
      // only on the version of the pod that still reports drained at the generation seen (a precondition of the patch).
      for (const name of opts.victims)
        await updateAnnotations(
          api,
          ref(name),
          (a) => {
            assertStillDrained(name, a, false, drainedAt.get(name) as string);
            return a[POD_DELETION_COST] === DRAINED_DELETION_COST ? null : { [POD_DELETION_COST]: DRAINED_DELETION_COST, ...(a[PREVIOUS_DELETION_COST] === undefined ? { [PREVIOUS_DELETION_COST]: a[POD_DELETION_COST] ?? '' } : {}) };
          },
          log,
        );
    } catch (err) {
      // Un-annotated, each victim resumes (and its worker restores its deletion cost); a deleted one is gone.
      const failed: string[] = [];
      for (const name of opts.victims) if (!deleted.has(name)) await patchAnnotations(api, ref(name), undrain, 'strategic-merge').catch(() => failed.push(name));
      const gone = deleted.size === 0 ? 'nothing was deleted' : `${[...deleted].join(', ')} already deleted`;
      const after = failed.length === 0 ? `every victim${deleted.size === 0 ? '' : ' not deleted'} was un-annotated (resumes); ${gone}` : `could not un-annotate ${failed.join(', ')} (remove ebb.dev/drain by hand); ${gone}`;
      throw new K8sError(`scale-down rolled back: ${(err as Error).message}; ${after}`, err instanceof K8sError ? err.kind : 'failed');
    }
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
