import type { Logger } from 'pino';
import type { WorkerRecord } from '../discovery/discovery.js';
import type { DrainIntent, DrainIntentStore } from '../discovery/drain-intent.js';
import type { DrainAccepted, Lifecycle, Transition } from '../lifecycle/lifecycle.js';

/** How long an operator's drain outlives the worker process by default (--drain-intent-ttl-ms). */
export const DEFAULT_DRAIN_INTENT_TTL_MS = 24 * 3600_000;

/**
 * Keeps the store in step with the operator: a drain (Admin API, CLI, dashboard) writes the intent,
 * with this worker's record so a restart under it can be found although it never registers; a
 * resume removes it. A drain that says `persist: false` (a rollout's, whose hook restarts the
 * worker; a Pod annotation's, which persists itself) writes none, and a SIGTERM shutdown is not an
 * intent: the replacement should serve.
 */
export function followDrainIntent(lifecycle: Lifecycle, store: DrainIntentStore, record: WorkerRecord, ttlMs: number, log: Logger): void {
  const failed = (what: string) => (err: unknown) =>
    log.warn({ event: 'drain_intent_failed', action: what, err: (err as Error).message }, `could not ${what} the drain intent: ${(err as Error).message} (a restart would not keep this state)`);
  lifecycle.on('drain_accepted', (d: DrainAccepted) => {
    if (!d.persist) return;
    const now = Date.now();
    const intent: DrainIntent = { reason: d.reason, at: new Date(now).toISOString(), expires_at: new Date(now + ttlMs).toISOString(), worker: record };
    void store.put(record.worker_id, intent, ttlMs).catch(failed('store'));
  });
  lifecycle.on('transition', (t: Transition) => {
    if (t.event === 'resume') void store.delete(record.worker_id).catch(failed('remove'));
  });
}

/**
 * A restart under an intent: the intent now names this process (its URLs changed), for the time it
 * had left. An intent without an expiry (written by an older ebb) gets the full TTL once.
 */
export async function adoptDrainIntent(store: DrainIntentStore, intent: DrainIntent, record: WorkerRecord, ttlMs: number): Promise<void> {
  const expires = intent.expires_at === undefined ? Date.now() + ttlMs : Date.parse(intent.expires_at);
  const left = expires - Date.now();
  if (!(left > 0)) return; // lapsing now: etcd removes it with its lease
  await store.put(record.worker_id, { ...intent, expires_at: new Date(expires).toISOString(), worker: record }, left);
}
