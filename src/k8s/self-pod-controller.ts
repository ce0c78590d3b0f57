import type { Logger } from 'pino';
import { Backoff, pause } from '../common/backoff.js';
import type { Lifecycle } from '../lifecycle/lifecycle.js';
import type { WorkerState } from '../lifecycle/states.js';
import { DRAINED_DELETION_COST, drainIntentOf, GENERATION, POD_DELETION_COST, PREVIOUS_DELETION_COST, STATE, STATE_SINCE, type Annotations, type DrainIntent } from './annotations.js';
import { podLabel, type PodApi, type PodRef, type V1Pod } from './client.js';
import { annotationsOf, updateAnnotations, type AnnotationPatch } from './pod-patcher.js';
import { PodWatcher } from './pod-watcher.js';

/** After a failed annotation write; every worker's write fails at once when the API server does. */
const WRITE_RETRY = { minMs: 250, maxMs: 5000, jitter: true };

/** States in which a ReplicaSet scale-down should pick this pod first. */
const LOW_COST_STATES: ReadonlySet<WorkerState> = new Set(['drained', 'stopping', 'failed', 'stopped']);

/**
 * Reads the pod before the worker registers: a pod annotated for drain starts the worker drained
 * (the intent survives a restart of the worker process). An API server that cannot be read fails
 * the start: the worker cannot know whether it is wanted, so it does not guess.
 */
export async function readSelfPod(api: PodApi, ref: PodRef): Promise<{ pod: V1Pod; intent: DrainIntent | null }> {
  let pod: V1Pod;
  try {
    pod = await api.get(ref);
  } catch (err) {
    throw new Error(`cannot read own pod ${podLabel(ref)} from the Kubernetes API at ${api.server}: ${(err as Error).message}`);
  }
  return { pod, intent: drainIntentOf(annotationsOf(pod), podLabel(ref)) };
}

/** The annotation changes that report `state`; null when the pod already says it. */
export function stateAnnotations(current: Annotations, state: WorkerState, since: string, generation: number): AnnotationPatch | null {
  const patch: AnnotationPatch = {};
  if (current[STATE] !== state) {
    patch[STATE] = state;
    patch[STATE_SINCE] = since;
  }
  if (current[GENERATION] !== String(generation)) patch[GENERATION] = String(generation);
  if (LOW_COST_STATES.has(state)) {
    // Saved once: a restarted worker finds the low cost already in force and must not save that.
    if (current[PREVIOUS_DELETION_COST] === undefined) patch[PREVIOUS_DELETION_COST] = current[POD_DELETION_COST] ?? '';
    if (current[POD_DELETION_COST] !== DRAINED_DELETION_COST) patch[POD_DELETION_COST] = DRAINED_DELETION_COST;
  } else if (state === 'serving' && current[PREVIOUS_DELETION_COST] !== undefined) {
    const previous = current[PREVIOUS_DELETION_COST];
    patch[POD_DELETION_COST] = previous === '' ? null : previous;
    patch[PREVIOUS_DELETION_COST] = null;
  }
  return Object.keys(patch).length === 0 ? null : patch;
}

const intentKey = (i: DrainIntent | null): string => (i === null ? '' : `${i.reason}\u0000${i.deadlineMs ?? ''}`);

/**
 * The worker's side of the Pod: follows its drain annotation (set: drain; removed: resume) and
 * writes its lifecycle state back. It acts on changes of the annotation only, as the API server
 * reports them; a lost watch, a 410 re-list or an outage carries no change and so moves nothing.
 * A drain or resume through the Admin API is left alone until the annotation itself changes.
 */
export class SelfPodController {
  private readonly watcher: PodWatcher;
  private readonly where: string;
  private intent: DrainIntent | null;
  private writing = false;
  private dirty = false;
  private closed = new AbortController();

  constructor(
    private readonly api: PodApi,
    private readonly ref: PodRef,
    private readonly lifecycle: Lifecycle,
    initialIntent: DrainIntent | null,
    private readonly log: Logger,
  ) {
    this.where = podLabel(ref);
    this.intent = initialIntent;
    this.watcher = new PodWatcher(api, { namespace: ref.namespace, fieldSelector: `metadata.name=${ref.name}` }, log);
  }

  async start(): Promise<void> {
    this.lifecycle.on('transition', () => this.report());
    this.watcher.on('pod', (pod: V1Pod) => this.onPod(pod));
    await this.watcher.start();
    this.report();
  }

  async close(): Promise<void> {
    this.closed.abort();
    await this.watcher.close();
  }

  private onPod(pod: V1Pod): void {
    const next = drainIntentOf(annotationsOf(pod), this.where);
    if (intentKey(next) === intentKey(this.intent)) return;
    const before = this.intent;
    this.intent = next;
    if (this.lifecycle.isShuttingDown) return;
    if (next !== null) {
      // persist: false, the annotation is the intent (it dies with the pod, as it should).
      this.log.info({ event: 'k8s_drain_annotation', pod: this.where, reason: next.reason, deadline_ms: next.deadlineMs ?? null }, `pod ${this.where} annotated for drain`);
      this.lifecycle.drain(next.reason, { deadlineMs: next.deadlineMs, actor: `annotation ebb.dev/drain on pod ${this.where}`, persist: false }).catch((err: Error) => this.log.warn({ event: 'k8s_drain_failed', err: err.message }, `drain from the annotation failed: ${err.message}`));
    } else if (before !== null) {
      this.log.info({ event: 'k8s_drain_annotation_removed', pod: this.where }, `drain annotation removed from pod ${this.where}: resuming`);
      this.lifecycle.resume({ actor: `annotation ebb.dev/drain removed from pod ${this.where}` }).catch((err: Error) => this.log.warn({ event: 'k8s_resume_failed', err: err.message }, `resume after the annotation was removed failed: ${err.message}`));
    }
  }

  /**
   * Writes the lifecycle's current state, coalesced: a burst of transitions is one write of the
   * latest, never an older state landing after a newer one. Failed writes retry until one lands.
   */
  private report(): void {
    this.dirty = true;
    if (this.writing) return;
    this.writing = true;
    void (async () => {
      const backoff = new Backoff(WRITE_RETRY);
      while (this.dirty && !this.closed.signal.aborted) {
        this.dirty = false;
        const { state, state_since, generation } = this.lifecycle.status();
        try {
          const pod = await updateAnnotations(this.api, this.ref, (current) => stateAnnotations(current, state, state_since, generation), this.log);
          const a = annotationsOf(pod);
          this.log.info({ event: 'k8s_state_written', pod: this.where, state, deletion_cost: a[POD_DELETION_COST] ?? null }, `pod ${this.where}: ${STATE}=${state}`);
          backoff.reset();
        } catch (err) {
          this.dirty = true;
          const delay = backoff.next();
          this.log.warn({ event: 'k8s_state_write_failed', pod: this.where, state, err: (err as Error).message, retry_in_ms: delay }, `could not write state to pod ${this.where}: ${(err as Error).message}`);
          if (!(await pause(delay, this.closed.signal))) break;
        }
      }
      this.writing = false;
    })();
  }
}
