import { isRecoverableError, type Etcd3 } from 'etcd3';
import { backoffDelay } from '../common/backoff.js';

/**
 * etcd3's default watch reconnect backoff grows to 30 s, and its WatchManager arms a (referenced)
 * reconnect timer for every stream error and end, even when the stream ended because we closed it.
 * Capping the backoff bounds both how late a frontend notices etcd is back and how long those
 * stray timers can hold the process open after close().
 */
const WATCH_BACKOFF = { minMs: 100, maxMs: 2_000, jitter: true };

/** Consecutive recoverable failures of one etcd host before calls to it are refused for a while. */
const BREAKER_THRESHOLD = 3;
/** Upper bound of that while; see HostBreaker. */
const BREAKER_OPEN_MAX_MS = 5_000;

/** Structurally a cockatiel IBackoff (etcd3's backoff type), without depending on cockatiel. */
export interface WatchBackoff {
  readonly duration: number;
  next(): WatchBackoff;
}

export function watchBackoff(attempt = 0): WatchBackoff {
  return { duration: backoffDelay(WATCH_BACKOFF, attempt), next: () => watchBackoff(attempt + 1) };
}

export type HostPolicy = ReturnType<NonNullable<NonNullable<NonNullable<ConstructorParameters<typeof Etcd3>[0]>['faultHandling']>['host']>>;

/**
 * Per-host circuit breaker for the etcd3 client, structurally the cockatiel policy it expects (etcd3
 * only calls execute()). etcd3's default opens for 5 s after 3 consecutive failures, and while open
 * every call fails without reaching etcd. After an outage longer than the leases, etcd comes back
 * with the lost leases renewed for about one TTL (then they expire and take the old keys along);
 * with a 5 s breaker, re-registrations kept failing past that, so with short TTLs frontends dropped
 * every worker for seconds while etcd and all workers were healthy. Here the open period is a
 * quarter of the lease TTL (at most 5 s); one failure after it re-opens, one success closes.
 */
export class HostBreaker {
  private failures = 0;
  private openUntil = 0;
  /** What opened the breaker: named in the refusal, which would otherwise hide the real cause (etcd unreachable). */
  private lastFailure = '';

  constructor(private readonly openMs: number) {}

  static forLeaseTtl(ttlS: number): HostBreaker {
    return new HostBreaker(Math.min(BREAKER_OPEN_MAX_MS, (ttlS * 1000) / 4));
  }

  async execute<T>(fn: (context: { signal: AbortSignal }) => PromiseLike<T> | T, signal?: AbortSignal): Promise<T> {
    if (Date.now() < this.openUntil) {
      // etcd3 recognises this flag: the call never went through, so it may try another host.
      throw Object.assign(new Error(`etcd unreachable (${this.lastFailure}); not retried for ${Math.ceil((this.openUntil - Date.now()) / 1000)} s`), { isBrokenCircuitError: true });
    }
    try {
      const result = await fn({ signal: signal ?? new AbortController().signal });
      this.failures = 0;
      return result;
    } catch (err) {
      if (typeof err === 'object' && err !== null && isRecoverableError(err as Error)) {
        this.failures++;
        this.lastFailure = (err as Error).message;
        if (this.failures >= BREAKER_THRESHOLD) {
          this.openUntil = Date.now() + this.openMs;
          this.failures = BREAKER_THRESHOLD - 1; // half-open afterwards: the next failure re-opens
        }
      }
      throw err;
    }
  }
}
