import type { Logger } from 'pino';
import type { Engine, EngineStats } from '../engine/engine.js';
import type { AuditTrail } from '../lifecycle/audit.js';
import type { WorkerMetrics } from './metrics.js';
import type { OpenRequests } from './open-requests.js';
import type { RequestScope } from './request-scope.js';

export interface PreemptionDeps {
  engine: Engine;
  open: OpenRequests;
  metrics: WorkerMetrics;
  log: Logger;
  /** Each preemption is in the worker's audit trail, in the lifecycle's generation. */
  audit?: { trail: AuditTrail; generation: () => number } | undefined;
}

/**
 * Priority without waiting for flex: a priority request that finds every batch slot running (its
 * first token would wait for a stream to end, past any target an idle fleet sets) pauses a running
 * flex stream its caller marked `preemptible`: that stream ends with a `preempted` hand-off line
 * (its KV state exported where the engine can), its slot goes to the priority request (the
 * engine's queue serves priority first), and its caller continues it later, exactly, here or
 * elsewhere. One stream per priority request that needs a slot: slots already being freed for
 * the priority requests ahead of it are counted.
 *
 * Decided when the priority request is admitted, and again whenever what the decision read
 * changes while priority requests wait in the engine's queue: a stream gets its first token (a
 * flex stream in its prefill cannot be paused yet; one that took the slot a priority request was
 * admitted to is running now), or a paused stream's slot comes back (it may have gone to a
 * priority request other than the one it was paused for). Deciding once left a priority request
 * that came while every flex stream was in its prefill waiting for a whole flex stream.
 */
export class Preemption {
  /** Streams paused whose slot is not back yet. */
  private readonly victims = new Set<RequestScope>();
  /** Priority requests admitted and without a first token yet (oldest first): whom a pause is for. */
  private readonly priority = new Set<RequestScope>();

  constructor(private readonly deps: PreemptionDeps) {}

  /** A request was admitted (its generation not yet asked for a slot). */
  admitted(scope: RequestScope): void {
    scope.onFirstPiece = this.firstPiece;
    if (scope.tier !== 'priority') return;
    this.priority.add(scope);
    scope.signal.addEventListener('abort', () => this.priority.delete(scope), { once: true });
    const stats = this.deps.engine.stats();
    // An engine server's own scheduler (no slots counted here), or a slot free now: nothing to do.
    if (!(stats.batch_slots > 0) || stats.running_sequences < stats.batch_slots) return;
    // It will wait behind the priority requests queued now: it needs one slot more than they take.
    this.pauseOneIfShort(queuedPriority(stats) + 1, scope.id);
  }

  private readonly firstPiece = (scope: RequestScope): void => {
    this.priority.delete(scope);
    this.reconsider();
  };

  /** Priority requests waiting in the engine's queue with fewer slots being freed for them: pause one more. */
  private reconsider(): void {
    const waiting = queuedPriority(this.deps.engine.stats());
    if (waiting > 0) this.pauseOneIfShort(waiting, this.priority.values().next().value?.id ?? 'queued');
  }

  private pauseOneIfShort(needed: number, by: string): void {
    if (this.victims.size >= needed) return;
    const victim = this.deps.open.preemptible();
    if (victim === undefined) return;
    this.victims.add(victim);
    victim.onSlotFreed = () => {
      this.victims.delete(victim);
      this.reconsider();
    };
    victim.preempt(by);
    this.deps.metrics.preempted();
    const detail = { request_id: victim.id, by, tokens: victim.generated };
    this.deps.log.info({ event: 'preempted', ...detail }, `flex request ${victim.id} paused after ${victim.generated} tokens: priority request ${by} takes its batch slot`);
    const audit = this.deps.audit;
    audit?.trail.record({ what: 'preempt', reason: `priority request ${by} found no free batch slot`, actor: 'priority request', generation: audit.generation(), result: 'handed_off', detail, startedAt: performance.now() });
  }
}

function queuedPriority(stats: EngineStats): number {
  return typeof stats.queued_priority_sequences === 'number' ? stats.queued_priority_sequences : 0;
}
