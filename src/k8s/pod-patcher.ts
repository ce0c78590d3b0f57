import type { Logger } from 'pino';
import { KubeError, podLabel, type PatchKind, type PodApi, type PodRef, type V1Pod } from './client.js';
import type { Annotations } from './annotations.js';

/** A change to annotations: a string sets one, null removes it (JSON merge patch semantics). */
export type AnnotationPatch = Record<string, string | null>;

/** Attempts at a read-modify-write before a run of 409 Conflicts is reported as a failure. */
const CONFLICT_ATTEMPTS = 8;

export const annotationsOf = (pod: V1Pod): Annotations => (pod.metadata?.annotations ?? {}) as Annotations;

/** Sets or removes annotations in one patch, last writer wins (what `kubectl annotate` does). */
export function patchAnnotations(api: PodApi, ref: PodRef, annotations: AnnotationPatch, kind: PatchKind = 'merge'): Promise<V1Pod> {
  return api.patch(ref, { metadata: { annotations } }, kind);
}

/**
 * Read-modify-write of annotations that depend on each other (the saved deletion cost and the one
 * in force): `compute` sees the pod as it is, and the patch carries that resourceVersion as a
 * precondition, so a write that raced ours is answered 409 Conflict and `compute` runs again on
 * the fresh pod. Resolves with the pod (unchanged when `compute` returns null: nothing to do).
 */
export async function updateAnnotations(api: PodApi, ref: PodRef, compute: (current: Annotations) => AnnotationPatch | null, log: Logger): Promise<V1Pod> {
  for (let attempt = 1; ; attempt++) {
    const pod = await api.get(ref);
    const patch = compute(annotationsOf(pod));
    if (patch === null) return pod;
    try {
      return await api.patch(ref, { metadata: { resourceVersion: pod.metadata?.resourceVersion, annotations: patch } }, 'merge');
    } catch (err) {
      if (!(err instanceof KubeError && err.code === 409) || attempt >= CONFLICT_ATTEMPTS) throw err;
      log.info({ event: 'k8s_patch_conflict', pod: podLabel(ref), attempt }, `pod ${podLabel(ref)} changed under our patch (409 Conflict): reading it again`);
    }
  }
}
