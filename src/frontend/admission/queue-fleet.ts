import type { Logger } from 'pino';
import type { Agent } from 'undici';
import { fetchLiveStatus } from '../../common/worker-admin.js';
import type { DrainIntentStore } from '../../discovery/drain-intent.js';
import type { FleetView } from '../admin/fleet-view.js';
import { NOTHING_SKIPPED, type WorkerPool } from '../routing/worker-pool.js';

/**
 * What the queue asks of the rest of the frontend: whether a worker may take a request of `model`
 * now (one in discovery and not held), and whether waiting can help at all (a worker in discovery,
 * or a drained one still answering that may resume).
 */
export interface QueueFleet {
  routable(model: string): number;
  /** `skip`: workers this request may not go to (the one a continuation leaves). */
  prospects(model: string, skip: ReadonlySet<string>): Promise<boolean>;
}

/** A departed worker's status read, when a request asks whether one may come back. */
const PROBE_TIMEOUT_MS = 1000;

/**
 * What the admission queue knows of a model's fleet. Waiting can help while a worker of the model is
 * in discovery and answering (draining, full: it may take the request soon), while one is loading
 * (registered as loading, on the side that generates: it serves once its engine is up), or while one that left it
 * still answers and is not shutting down (drained: it may resume). A departed worker is asked once
 * per request that finds no other; one whose system server refuses connections is forgotten then
 * (FleetView.forgetIfGone), so a model whose workers are all gone fails fast. A worker under a drain
 * intent (etcd: it comes back drained after a restart, for an operator to resume) counts as one that
 * may come back too, while its process restarts.
 *
 * A model whose last worker left discovery draining for its exit (SIGTERM: a restart, as a
 * StatefulSet or a supervisor does it, or a scale-down; ebb cannot tell which) may have a
 * replacement loading: for `timeoutMs` (the queue timeout) after it left, waiting can help. Its
 * status is read once when it leaves; a worker that no longer answers then (it crashed: its record
 * went with its process or its lease) is a failure, not a restart, and its model fails fast.
 */
export function queueFleet(pool: WorkerPool, fleet: FleetView, agent: Agent, opts: { timeoutMs: number; log: Logger; workerAdminToken?: string | undefined }, intents?: DrainIntentStore): QueueFleet {
  const read = { token: opts.workerAdminToken };
  /** Per model: when its last worker left discovery shutting down (see above). */
  const restarting = new Map<string, number>();
  fleet.on('left', (id: string, at: number) => {
    const k = fleet.get(id);
    if (k === undefined || k.record.mode === 'prefill' || pool.mayServeSoon(k.record.model, NOTHING_SKIPPED)) return;
    const model = k.record.model;
    void fetchLiveStatus(k.record.system_url, id, agent, PROBE_TIMEOUT_MS, read).then((live) => {
      if (!live.reachable || !live.status.shutting_down || pool.mayServeSoon(model, NOTHING_SKIPPED)) return;
      restarting.set(model, at);
      opts.log.info({ event: 'model_restarting', model, worker_id: id }, `the last worker of "${model}" left shutting down: its requests wait up to ${opts.timeoutMs} ms for a replacement`);
    });
  });
  const mayRestart = (model: string): boolean => {
    const at = restarting.get(model);
    if (at === undefined) return false;
    if (Date.now() - at < opts.timeoutMs) return true;
    restarting.delete(model);
    return false;
  };
  return {
    routable: (model) => pool.routable(model),
    async prospects(model, skip) {
      // The workers that would generate it (a disaggregated model's decode workers), unless they stopped answering;
      // or one loading (registered as loading: its engine loads, as at a fleet's start).
      if (pool.mayServeSoon(model, skip) || pool.loadingFor(model, skip)) return true;
      const departed = fleet.all().filter((k) => !k.inDiscovery && k.record.model === model && k.record.mode !== 'prefill' && !skip.has(k.record.worker_id));
      const answers = await Promise.all(
        departed.map(async (k) => {
          const live = await fetchLiveStatus(k.record.system_url, k.record.worker_id, agent, PROBE_TIMEOUT_MS, read);
          if (fleet.forgetIfGone(k.record.worker_id, live)) return false;
          // One that answers with an error (a token it wants, a slow read) is not known gone yet.
          return !live.reachable || !live.status.shutting_down;
        }),
      );
      if (answers.some(Boolean) || mayRestart(model)) return true;
      const held = await intents?.list().catch(() => undefined);
      const now = Date.now();
      for (const [id, intent] of held ?? []) if (intent.worker?.model === model && !skip.has(id) && !(intent.expires_at !== undefined && Date.parse(intent.expires_at) <= now)) return true;
      return false;
    },
  };
}
