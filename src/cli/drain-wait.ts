import { pause } from '../common/backoff.js';
import type { WorkerStatus } from '../common/worker-admin.js';
import type { FleetEntry, WorkerRef } from './admin-client.js';
import { CliError, EXIT_TIMEOUT } from './cli-error.js';
import { describeWaiting, formatDuration } from './progress-line.js';

/** How often a waiting command re-reads /engine/status. */
export const POLL_INTERVAL_MS = 250;

/**
 * Follows the worker's status until it reports `drained` at `generation`, the one the drain call
 * answered with. Every drain and resume bumps the generation, so a different one means someone
 * else resumed (and maybe drained again) meanwhile: that "drained" is not ours to report.
 *
 * The status is pushed (the worker's status stream, or the frontend's fleet stream); only where no
 * stream can be had (an older worker or frontend) or it breaks off, GET /engine/status is read
 * every POLL_INTERVAL_MS instead. Throws CliError(EXIT_TIMEOUT) past the deadline,
 * CliError(EXIT_FAILURE) on another generation, a worker shutting down, or one that stops answering;
 * `signal`'s reason once it aborts (an interrupted command rolls back).
 */
export async function waitForDrained(
  ref: WorkerRef,
  generation: number,
  timeoutMs: number,
  onProgress: (status: WorkerStatus, elapsedMs: number) => void = () => undefined,
  signal?: AbortSignal,
): Promise<WorkerStatus> {
  signal?.throwIfAborted();
  const started = Date.now();
  let last: WorkerStatus | undefined;
  const timedOut = () => {
    const where = last ? ` (still ${describeWaiting(last, false)})` : '';
    return new CliError(`${ref.label} did not drain within ${formatDuration(timeoutMs)}${where}; it stays out of rotation until resumed`, EXIT_TIMEOUT);
  };
  /** The checks every status read goes through; the status when it is ours and drained. */
  const check = (status: WorkerStatus): WorkerStatus | undefined => {
    last = status;
    onProgress(status, Date.now() - started);
    if (status.state === 'stopping' || status.state === 'failed' || status.state === 'stopped')
      throw new CliError(`${ref.label} is shutting down (${status.state}) while waiting for it to drain`);
    if (status.generation !== generation)
      throw new CliError(
        `${ref.label} went from generation ${generation} to ${status.generation} (now ${status.state}) while waiting for it to drain: ` +
          'someone else resumed or drained it, so this drain is no longer ours to follow',
      );
    return status.state === 'drained' ? status : undefined;
  };

  const timeout = AbortSignal.timeout(timeoutMs);
  const deadline = signal ? AbortSignal.any([timeout, signal]) : timeout;
  try {
    for await (const status of ref.statusEvents(deadline)) {
      const done = check(status);
      if (done) return done;
    }
  } catch (err) {
    if (err instanceof CliError) throw err;
    signal?.throwIfAborted();
    if (timeout.aborted) throw timedOut();
    // No stream (or it broke off): read the status instead, below.
  }

  let failures = 0;
  for (;;) {
    let status: WorkerStatus | undefined;
    try {
      status = await ref.status();
      failures = 0;
    } catch (err) {
      // One failed read can be a blip (a busy event loop, a timeout); three in a row means it is gone.
      if (!(err instanceof CliError) || ++failures >= 3) throw err;
    }
    const done = status && check(status);
    if (done) return done;
    const elapsed = Date.now() - started;
    if (elapsed >= timeoutMs) throw timedOut();
    await pause(Math.min(POLL_INTERVAL_MS, timeoutMs - elapsed), signal);
    signal?.throwIfAborted();
  }
}

/** The workers of a model that are in rotation: listed in discovery, reachable, and serving. */
export function servingOf(fleet: FleetEntry[], model: string): FleetEntry[] {
  return fleet.filter((e) => e.model === model && e.in_discovery && e.reachable && e.state === 'serving');
}

/**
 * The workers of a model in rotation that every frontend routes to (each marks it in discovery):
 * what a rollout waits for before it takes the next worker out. A worker whose status says nothing
 * of it (older than the marks) counts as serving.
 */
export function routedOf(fleet: FleetEntry[], model: string): FleetEntry[] {
  return servingOf(fleet, model).filter((e) => e.status?.routed !== false);
}
