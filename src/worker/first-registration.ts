import type { Logger } from 'pino';
import { Backoff, pause } from '../common/backoff.js';

/** How long a starting worker keeps trying to register before it gives up (--register-timeout-ms). */
export const DEFAULT_REGISTER_TIMEOUT_MS = 30_000;

/**
 * The first registration, retried with back-off: discovery that is briefly unreachable at start (etcd
 * restarting, a pod scheduled before its etcd) must not make the worker exit at once. Past
 * `timeoutMs` it fails with the real cause; `signal` (SIGTERM) stops the retries.
 */
export async function registerFirst(timeoutMs: number, discoveryUrl: string, log: Logger, signal: AbortSignal, start: () => Promise<void>): Promise<void> {
  const started = Date.now();
  // Jittered: after an etcd outage, every worker starting against it must not retry in step.
  const backoff = new Backoff({ minMs: 100, maxMs: 2000, jitter: true });
  for (let attempt = 1; ; attempt++) {
    try {
      await start();
      return;
    } catch (err) {
      const cause = (err as Error).message;
      const left = timeoutMs - (Date.now() - started);
      if (left <= 0 || signal.aborted) throw new Error(`could not register in discovery ${discoveryUrl} within ${Math.round(timeoutMs / 1000)} s (${attempt} attempts): ${cause}`);
      const delay = Math.min(backoff.next(), left);
      log.warn({ event: 'discovery_register_retry', attempt, err: cause, retry_in_ms: delay }, `registering in ${discoveryUrl} failed (${cause}); retrying`);
      await pause(delay, signal);
    }
  }
}
