import type { Logger } from 'pino';
import type { DrainIntentStore } from '../discovery/drain-intent.js';
import type { Lifecycle, Transition } from '../lifecycle/lifecycle.js';

/** How long an operator's drain outlives the worker process by default (--drain-intent-ttl-ms). */
export const DEFAULT_DRAIN_INTENT_TTL_MS = 24 * 3600_000;

/**
 * Keeps the store in step with the operator: a drain (Admin API, CLI, dashboard) writes the intent,
 * a resume removes it, so a worker restarted in between comes back drained. A SIGTERM shutdown is
 * not an intent: the replacement should serve.
 */
export function followDrainIntent(lifecycle: Lifecycle, store: DrainIntentStore, workerId: string, ttlMs: number, log: Logger): void {
  const failed = (what: string) => (err: unknown) =>
    log.warn({ event: 'drain_intent_failed', action: what, err: (err as Error).message }, `could not ${what} the drain intent: ${(err as Error).message} (a restart would not keep this state)`);
  lifecycle.on('transition', (t: Transition) => {
    if (t.event === 'drain' && t.from === 'serving') {
      const reason = lifecycle.status().drain_reason ?? 'drain';
      void store.put(workerId, { reason, at: new Date().toISOString() }, ttlMs).catch(failed('store'));
    } else if (t.event === 'resume') void store.delete(workerId).catch(failed('remove'));
  });
}
