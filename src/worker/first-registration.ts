import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';

/** How long a starting worker keeps trying to register before it gives up (--register-timeout-ms). */
export const DEFAULT_REGISTER_TIMEOUT_MS = 30_000;

/**
 * The first registration, retried with back-off: discovery that is briefly unreachable at start (etcd
 * restarting, a pod scheduled before its etcd) must not make the worker exit at once. Past
 * `timeoutMs` it fails with the real cause; `signal` (SIGTERM) stops the retries.
 */
export async function registerFirst(timeoutMs: number, discoveryUrl: string, log: Logger, signal: AbortSignal, start: () => Promise<void>): Promise<void> {
  const started = Date.now();
  for (let backoff = 100, attempt = 1; ; backoff = Math.min(backoff * 2, 2000), attempt++) {
    try {
      await start();
      return;
    } catch (err) {
      const cause = (err as Error).message;
      const left = timeoutMs - (Date.now() - started);
      if (left <= 0 || signal.aborted) throw new Error(`could not register in discovery ${discoveryUrl} within ${Math.round(timeoutMs / 1000)} s (${attempt} attempts): ${cause}`);
      log.warn({ event: 'discovery_register_retry', attempt, err: cause, retry_in_ms: Math.min(backoff, left) }, `registering in ${discoveryUrl} failed (${cause}); retrying`);
      await sleep(Math.min(backoff, left), undefined, { signal }).catch(() => undefined);
    }
  }
}
