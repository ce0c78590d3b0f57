import { setTimeout as sleep } from 'node:timers/promises';

/**
 * How long to wait before trying again: from `minMs`, doubling per failed attempt, capped at
 * `maxMs`. With `jitter`, each delay is drawn from [d/2, d]: peers that failed together against one
 * server (workers re-registering in etcd, frontends resubscribing to a restarted worker) must not
 * all retry in the same millisecond.
 */
export interface BackoffPolicy {
  minMs: number;
  maxMs: number;
  jitter?: boolean;
}

/** The delay before retry number `attempt` (0: the first retry). */
export function backoffDelay(policy: BackoffPolicy, attempt: number): number {
  const ceiling = Math.min(policy.maxMs, policy.minMs * 2 ** Math.min(attempt, 30));
  return Math.round(policy.jitter ? ceiling / 2 + (Math.random() * ceiling) / 2 : ceiling);
}

/** One retry loop's back-off: `next()` after a failure, `reset()` after a success. */
export class Backoff {
  private attempt = 0;

  constructor(readonly policy: BackoffPolicy) {}

  /** The delay to wait now; the one after it is twice as long, up to the cap. */
  next(): number {
    return backoffDelay(this.policy, this.attempt++);
  }

  /** It worked: the next failure waits the shortest delay again. */
  reset(): void {
    this.attempt = 0;
  }
}

/**
 * Waits `ms` (a retry's back-off: the event waited for is "time to try again"); resolves false,
 * at once, when `signal` aborts (closing, SIGTERM), true when the time has passed.
 */
export async function pause(ms: number, signal?: AbortSignal): Promise<boolean> {
  try {
    await sleep(ms, undefined, { signal });
    return true;
  } catch {
    return false;
  }
}
