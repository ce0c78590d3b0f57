import type { Logger } from 'pino';
import { formatDuration } from '../common/format-duration.js';
import { K8sError } from './k8s-error.js';
import { DRAIN, DRAIN_DEADLINE_MS, DRAIN_REASON, STATE } from './annotations.js';
import { type PodApi, type V1Pod } from './client.js';
import { annotationsOf, patchAnnotations } from './pod-patcher.js';
import { PodWatcher } from './pod-watcher.js';

export interface K8sRolloutOptions {
  namespace: string;
  selector: string;
  maxUnavailable: number;
  /** Delete each drained pod; otherwise wait for its controller to (its deletion cost is the lowest). */
  deletePods: boolean;
  /** Bound on each drain and on each wait for the replacement. */
  timeoutMs: number;
  drainDeadlineMs?: number | undefined;
  say: (line: string) => void;
}

const nameOf = (p: V1Pod): string => p.metadata?.name ?? '';
const stateOf = (p: V1Pod): string | undefined => annotationsOf(p)[STATE];
const terminating = (p: V1Pod): boolean => p.metadata?.deletionTimestamp != null;
const serving = (p: V1Pod): boolean => !terminating(p) && stateOf(p) === 'serving';

/**
 * Drain-wait-delete over the pods of a label selector: annotate a batch for drain, wait until each
 * reports ebb.dev/state=drained, delete it (or leave it to its controller), wait until the selector
 * is back to its serving count, go on. A pod that does not drain in time stops the rollout: its
 * batch's annotations are removed (they resume) and the rest were never touched.
 *
 * Every wait follows the pods through one list+watch (PodWatcher): the pods' annotations are the
 * workers' own report, so nothing here polls.
 */
export async function k8sRollout(api: PodApi, opts: K8sRolloutOptions, log: Logger): Promise<number> {
  const { say } = opts;
  const watcher = new PodWatcher(api, { namespace: opts.namespace, labelSelector: opts.selector }, log);
  try {
    await watcher.start();
  } catch (err) {
    throw new K8sError(`cannot list pods ${opts.selector} in ${opts.namespace} at ${api.server}: ${(err as Error).message}`);
  }
  /** Resolves once `done()` holds, re-checked on every change the watch reports; rejects past the bound. */
  const until = (done: () => boolean, timeoutMs: number, what: () => string): Promise<void> =>
    new Promise((resolve, reject) => {
      const check = () => {
        let ok: boolean;
        try {
          ok = done();
        } catch (err) {
          cleanup();
          reject(err as Error);
          return;
        }
        if (!ok) return;
        cleanup();
        resolve();
      };
      const timer = setTimeout(() => {
        cleanup();
        reject(new K8sError(what(), 'timed_out'));
      }, timeoutMs);
      const cleanup = () => {
        clearTimeout(timer);
        for (const e of ['pod', 'deleted', 'relisted']) watcher.off(e, check);
      };
      for (const e of ['pod', 'deleted', 'relisted']) watcher.on(e, check);
      check();
    });
  const pods = () => [...watcher.pods.values()];
  const ref = (name: string) => ({ namespace: opts.namespace, name });
  const undrain = { [DRAIN]: null, [DRAIN_REASON]: null, [DRAIN_DEADLINE_MS]: null };

  try {
    const initial = pods().filter(serving).map(nameOf).sort();
    if (initial.length === 0) throw new K8sError(`no serving pod matches ${opts.selector} in namespace ${opts.namespace} (pods report ebb.dev/state; are the workers run with --k8s-self-pod?)`);
    const total = initial.length;
    say(`rollout of pods ${opts.selector} in ${opts.namespace}: ${total} pod(s), at most ${opts.maxUnavailable} out of rotation at a time`);
    let done = 0;
    for (let i = 0; i < initial.length; i += opts.maxUnavailable) {
      const want = pods().filter(serving).length;
      const batch: string[] = [];
      for (const name of initial.slice(i, i + opts.maxUnavailable)) {
        const pod = watcher.pods.get(name);
        if (pod && serving(pod)) batch.push(name);
        else say(`[${++done}/${total}] ${name}: skipped, no longer serving`);
      }
      if (batch.length === 0) continue;
      const reason = `ebb rollout ${opts.selector}`;
      for (const name of batch) {
        say(`[${done + 1 + batch.indexOf(name)}/${total}] ${name}: draining`);
        // Strategic merge, as `kubectl annotate` sends it: only these keys change.
        await patchAnnotations(api, ref(name), { [DRAIN]: 'true', [DRAIN_REASON]: reason, [DRAIN_DEADLINE_MS]: opts.drainDeadlineMs === undefined ? null : String(opts.drainDeadlineMs) }, 'strategic-merge');
      }
      const t0 = Date.now();
      try {
        await Promise.all(
          batch.map(async (name) => {
            await until(
              () => {
                const p = watcher.pods.get(name);
                if (p === undefined || terminating(p)) throw new K8sError(`pod ${name} went away while draining`);
                return stateOf(p) === 'drained';
              },
              opts.timeoutMs,
              () => `pod ${name} did not drain within ${formatDuration(opts.timeoutMs)} (ebb.dev/state=${stateOf(watcher.pods.get(name) ?? {}) ?? 'none'})`,
            );
            say(`  ${name}: drained in ${formatDuration(Date.now() - t0)}`);
          }),
        );
      } catch (err) {
        for (const name of batch) await patchAnnotations(api, ref(name), undrain, 'strategic-merge').catch(() => undefined);
        throw new K8sError(`rollout stopped: ${(err as Error).message}; its batch was un-annotated (resumes), ${done} of ${total} pod(s) were rolled and the rest are serving`, err instanceof K8sError ? err.kind : 'failed');
      }
      for (const name of batch) {
        if (opts.deletePods) {
          await api.delete(ref(name));
          say(`  ${name}: deleted`);
        } else say(`  ${name}: drained, deletion cost lowest; waiting for its controller to delete it`);
      }
      const rolled = new Set(batch);
      await until(
        () => batch.every((n) => !watcher.pods.has(n) || terminating(watcher.pods.get(n) as V1Pod)) && pods().filter((p) => serving(p) && !rolled.has(nameOf(p))).length >= want,
        opts.timeoutMs,
        () => `${opts.selector} is not back to ${want} serving pod(s) within ${formatDuration(opts.timeoutMs)} (serving: ${pods().filter(serving).map(nameOf).join(', ') || 'none'})`,
      );
      done += batch.length;
      say(`[${done}/${total}] ${opts.selector} is back to ${want} serving pod(s)`);
    }
    return total;
  } finally {
    await watcher.close();
  }
}
