import type { Logger } from 'pino';
import { Backoff, pause } from '../common/backoff.js';
import type { NodeApi, PodApi, PodRef, V1Node, V1Pod } from '../k8s/client.js';
import { podLabel } from '../k8s/client.js';
import { PodWatcher } from '../k8s/pod-watcher.js';
import { FirstSeen, sameNotices, type DisruptionSource, type Notice } from './notice.js';

/**
 * Kubernetes: the worker's own Pod and its Node, each followed by a list+watch. The Pod's
 * condition DisruptionTarget (status True) says the pod is about to be deleted by a disruption
 * (preemption, a taint manager's eviction, an Eviction API call, the kubelet's node shutdown). The
 * Node's taints say it is being removed: the cluster autoscaler's ToBeDeletedByClusterAutoscaler,
 * Karpenter's karpenter.sh/disrupted (karpenter.sh/disruption before v1), and
 * node.kubernetes.io/out-of-service. A cordon (spec.unschedulable, taint
 * node.kubernetes.io/unschedulable) is a hint, not a removal: a notice only with `onCordon`.
 * Neither says when the pod goes: it has its terminationGracePeriodSeconds from the deletion on,
 * so a notice's time is the deletion's (deletionTimestamp, once set) or the signal's time plus that
 * grace. A condition set False or a taint removed withdraws the notice.
 */

export const DISRUPTION_TARGET = 'DisruptionTarget';
/** Node taints that announce the node's removal. */
export const REMOVAL_TAINTS: ReadonlySet<string> = new Set(['ToBeDeletedByClusterAutoscaler', 'karpenter.sh/disrupted', 'karpenter.sh/disruption', 'node.kubernetes.io/out-of-service']);
export const CORDON_TAINT = 'node.kubernetes.io/unschedulable';
/** The API's default terminationGracePeriodSeconds. */
const DEFAULT_GRACE_S = 30;
const START_RETRY = { minMs: 500, maxMs: 10_000, jitter: true };

export interface K8sSourceOptions {
  pods: PodApi;
  nodes: NodeApi;
  ref: PodRef;
  /** The pod's node when known up front (env NODE_NAME from the downward API); else read from the pod. */
  nodeName?: string | undefined;
  /** A cordon alone drains too (--disruption-on-cordon). */
  onCordon: boolean;
  log: Logger;
}

/** A time as the client hands it over (a Date once deserialised, a string otherwise). */
function timeOf(v: Date | string | undefined | null): number | undefined {
  if (v === undefined || v === null) return undefined;
  const t = v instanceof Date ? v.getTime() : Date.parse(v);
  return Number.isFinite(t) ? t : undefined;
}

export function k8sSource(opts: K8sSourceOptions): DisruptionSource {
  const { log, ref } = opts;
  const stop = new AbortController();
  const podWatcher = new PodWatcher<V1Pod>(opts.pods, { namespace: ref.namespace, fieldSelector: `metadata.name=${ref.name}` }, log);
  let nodeWatcher: PodWatcher<V1Node> | undefined;
  let pod: V1Pod | undefined;
  let node: V1Node | undefined;
  const firstSeen = new FirstSeen();
  let hinted = false;
  let last: Notice[] | undefined;
  const starting: Array<Promise<void>> = [];

  const graceMs = () => (pod?.spec?.terminationGracePeriodSeconds ?? DEFAULT_GRACE_S) * 1000;

  const notices = (): Notice[] => {
    firstSeen.begin();
    const out: Notice[] = [];
    const deletion = timeOf(pod?.metadata?.deletionTimestamp);
    const target = pod?.status?.conditions?.find((c) => c.type === DISRUPTION_TARGET && c.status === 'True');
    if (target !== undefined) {
      const id = `pod ${DISRUPTION_TARGET}`;
      const since = timeOf(target.lastTransitionTime) ?? firstSeen.at(id);
      out.push({ source: 'k8s', id, what: `pod ${podLabel(ref)} condition ${DISRUPTION_TARGET} (${target.reason ?? 'no reason'})`, at: deletion ?? since + graceMs() });
    }
    const name = node?.metadata?.name ?? '';
    for (const taint of node?.spec?.taints ?? []) {
      const cordon = taint.key === CORDON_TAINT;
      if (!REMOVAL_TAINTS.has(taint.key) && !(cordon && opts.onCordon)) continue;
      const id = `node taint ${taint.key}`;
      const since = timeOf(taint.timeAdded) ?? firstSeen.at(id);
      out.push({ source: 'k8s', id, what: `node ${name} taint ${taint.key}${taint.value ? `=${taint.value}` : ''}:${taint.effect}`, at: deletion ?? since + graceMs() });
    }
    if (opts.onCordon && node?.spec?.unschedulable === true && !out.some((n) => n.id === `node taint ${CORDON_TAINT}`)) {
      const id = 'node unschedulable';
      out.push({ source: 'k8s', id, what: `node ${name} cordoned (spec.unschedulable)`, at: deletion ?? firstSeen.at(id) + graceMs() });
    }
    const cordoned = node?.spec?.unschedulable === true || (node?.spec?.taints ?? []).some((t) => t.key === CORDON_TAINT);
    if (cordoned && !opts.onCordon && !hinted) log.info({ event: 'disruption_hint', source: 'k8s', node: name }, `node ${name} is cordoned: a hint, not a removal (no drain without --disruption-on-cordon)`);
    hinted = cordoned;
    return out;
  };

  /** Starts a watcher, retrying its first list until the API server answers (or the source closes). */
  const startWatcher = async (w: PodWatcher<V1Pod> | PodWatcher<V1Node>, what: string): Promise<void> => {
    const backoff = new Backoff(START_RETRY);
    for (;;) {
      try {
        await w.start();
        return;
      } catch (err) {
        if (stop.signal.aborted) return;
        log.warn({ event: 'disruption_source_failed', source: 'k8s', watching: what, err: (err as Error).message }, `cannot watch ${what} yet: ${(err as Error).message}`);
        if (!(await pause(backoff.next(), stop.signal))) return;
      }
    }
  };

  return {
    name: 'k8s',
    start(report) {
      if (starting.length > 0) return;
      const changed = () => {
        const now = notices();
        if (last !== undefined && sameNotices(last, now)) return;
        last = now;
        report(now);
      };
      const followNode = (nodeName: string) => {
        if (nodeWatcher !== undefined || stop.signal.aborted) return;
        const w = new PodWatcher<V1Node>(opts.nodes, { namespace: '', fieldSelector: `metadata.name=${nodeName}` }, log);
        nodeWatcher = w;
        w.on('pod', (n: V1Node) => {
          node = n;
          changed();
        });
        w.on('deleted', () => {
          node = undefined;
          changed();
        });
        starting.push(startWatcher(w, `node ${nodeName}`));
      };
      podWatcher.on('pod', (p: V1Pod) => {
        pod = p;
        const nodeName = opts.nodeName ?? p.spec?.nodeName;
        if (nodeName) followNode(nodeName);
        changed();
      });
      if (opts.nodeName) followNode(opts.nodeName);
      starting.push(startWatcher(podWatcher, `pod ${podLabel(ref)}`));
    },
    async close() {
      stop.abort();
      await Promise.all(starting);
      await Promise.all([podWatcher.close(), nodeWatcher?.close()]);
    },
  };
}
