import type { WorkerStatus } from '../../protocol/admin.js';
import type { WorkerRecord } from '../../discovery/discovery.js';
import type { PoolCapacity } from '../metrics.js';
import { rankPools, type Candidate } from './victim-ranking.js';

/** A worker of the fleet view with its live status (what GET /workers lists). */
export type LiveEntry = WorkerRecord & { in_discovery: boolean; reachable: boolean; status?: WorkerStatus | undefined };

/** The serving workers of the fleet, as the victim ranking takes them: in discovery, answering, serving. */
export function servingCandidates(entries: readonly LiveEntry[], model?: string): Candidate[] {
  return entries.flatMap((e) =>
    (model === undefined || e.model === model) && e.in_discovery && e.reachable && e.status?.state === 'serving' ? [{ worker_id: e.worker_id, mode: e.mode, status: e.status }] : [],
  );
}

/** The model's workers in discovery whose status could not be read: a ranking without them is partial. */
export function unansweredWorkers(entries: readonly LiveEntry[], model: string): string[] {
  return entries.flatMap((e) => (e.model === model && e.in_discovery && (!e.reachable || e.status === undefined) ? [e.worker_id] : []));
}

/** Per model and pool: what an autoscaler sizes by (see registerFleetMetrics). Every known model is there. */
export function fleetCapacity(entries: readonly LiveEntry[]): PoolCapacity[] {
  const pools = new Map<string, PoolCapacity>();
  const poolOf = (model: string, mode: string): PoolCapacity => {
    const key = `${model}\u0000${mode}`;
    let c = pools.get(key);
    if (c === undefined) pools.set(key, (c = { model, mode, serving: 0, draining: 0, inflight: 0, drainable: 0, drainEtaMs: null }));
    return c;
  };
  for (const e of entries) {
    const c = poolOf(e.model, e.mode);
    if (!e.reachable || e.status === undefined) continue;
    c.inflight += e.status.inflight_requests;
    if (e.status.state === 'draining') c.draining++;
  }
  for (const model of new Set(entries.map((e) => e.model))) {
    for (const [mode, ranking] of rankPools(servingCandidates(entries, model))) {
      const c = poolOf(model, mode);
      c.serving = ranking.length;
      c.drainable = Math.min(Math.max(0, ranking.length - 1), ranking.filter((r) => r.eta_if_drained_ms === 0).length);
      c.drainEtaMs = ranking[0]?.eta_if_drained_ms ?? null;
    }
  }
  return [...pools.values()].sort((a, b) => a.model.localeCompare(b.model) || a.mode.localeCompare(b.mode));
}
