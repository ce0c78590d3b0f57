import type { Logger } from 'pino';
import type { Engine } from '../engine/engine.js';
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
 * Priority without waiting for flex: a priority request admitted while every batch slot runs (its
 * first token would wait for a stream to end, past any target an idle fleet sets) pauses a running
 * flex stream its caller marked `preemptible`: that stream ends with a `preempted` hand-off line
 * (its KV state exported where the engine can), its slot goes to the priority request (the
 * engine's queue serves priority first), and its caller continues it later, exactly, here or
 * elsewhere. One stream per priority request that needs a slot: slots already being freed for
 * the priority requests ahead of it are counted.
 */
export class Preemption {
  /** Streams paused whose slot may not be back yet. */
  private readonly victims = new Set<RequestScope>();

  constructor(private readonly deps: PreemptionDeps) {}

  /** A request was admitted (its generation not yet asked for a slot). */
  admitted(scope: RequestScope): void {
    if (scope.tier !== 'priority') return;
    const stats = this.deps.engine.stats();
    // An engine server's own scheduler (no slots counted here), or a slot free now: nothing to do.
    if (!(stats.batch_slots > 0) || stats.running_sequences < stats.batch_slots) return;
    for (const v of this.victims) if (v.slotFreed) this.victims.delete(v);
    const ahead = typeof stats.queued_priority_sequences === 'number' ? stats.queued_priority_sequences : 0;
    // Slots being freed reach the priority requests queued first: this one needs one more than they take.
    if (this.victims.size > ahead) return;
    const victim = this.deps.open.preemptible();
    if (victim === undefined) return;
    this.victims.add(victim);
    victim.preempt(scope.id);
    this.deps.metrics.preempted();
    const detail = { request_id: victim.id, by: scope.id, tokens: victim.generated };
    this.deps.log.info({ event: 'preempted', ...detail }, `flex request ${victim.id} paused after ${victim.generated} tokens: priority request ${scope.id} takes its batch slot`);
    const audit = this.deps.audit;
    audit?.trail.record({ what: 'preempt', reason: `priority request ${scope.id} found no free batch slot`, actor: 'priority request', generation: audit.generation(), result: 'handed_off', detail, startedAt: performance.now() });
  }
}
