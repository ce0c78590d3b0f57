import type { WorkerStatus } from '../common/worker-admin.js';
import type { FleetEntry, WorkerRef } from './admin-client.js';
import { CliError, EXIT_TIMEOUT } from './cli-error.js';
import { describeWaiting, formatDuration } from './progress-line.js';

/** How often a waiting command re-reads /engine/status. */
export const POLL_INTERVAL_MS = 250;

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * Polls the worker's status until it reports `drained` at `generation`, the one the drain call
 * answered with. Every drain and resume bumps the generation, so a different one means someone
 * else resumed (and maybe drained again) meanwhile: that "drained" is not ours to report.
 *
 * The worker has no push channel for its state (the Admin API is request/response), so polling GET
 * /engine/status every POLL_INTERVAL_MS is the only signal there is; the worker serves it from
 * memory, so it costs next to nothing. Throws CliError(EXIT_TIMEOUT) past the deadline,
 * CliError(EXIT_FAILURE) on another generation, a worker shutting down, or one that stops answering.
 */
export async function waitForDrained(
  ref: WorkerRef,
  generation: number,
  timeoutMs: number,
  onProgress: (status: WorkerStatus, elapsedMs: number) => void = () => undefined,
): Promise<WorkerStatus> {
  const started = Date.now();
  let failures = 0;
  let last: WorkerStatus | undefined;
  for (;;) {
    let status: WorkerStatus | undefined;
    try {
      status = await ref.status();
      failures = 0;
    } catch (err) {
      // One failed read can be a blip (a busy event loop, a timeout); three in a row means it is gone.
      if (!(err instanceof CliError) || ++failures >= 3) throw err;
    }
    if (status) {
      last = status;
      onProgress(status, Date.now() - started);
      if (status.state === 'stopping' || status.state === 'stopped')
        throw new CliError(`${ref.label} is shutting down (${status.state}) while waiting for it to drain`);
      if (status.generation !== generation)
        throw new CliError(
          `${ref.label} went from generation ${generation} to ${status.generation} (now ${status.state}) while waiting for it to drain: ` +
            'someone else resumed or drained it, so this drain is no longer ours to follow',
        );
      if (status.state === 'drained') return status;
    }
    const elapsed = Date.now() - started;
    if (elapsed >= timeoutMs) {
      const where = last ? ` (still ${describeWaiting(last, false)})` : '';
      throw new CliError(`${ref.label} did not drain within ${formatDuration(timeoutMs)}${where}; it stays out of rotation until resumed`, EXIT_TIMEOUT);
    }
    await sleep(Math.min(POLL_INTERVAL_MS, timeoutMs - elapsed));
  }
}

/** The workers of a model that are in rotation: listed in discovery, reachable, and serving. */
export function servingOf(fleet: FleetEntry[], model: string): FleetEntry[] {
  return fleet.filter((e) => e.model === model && e.in_discovery && e.reachable && e.state === 'serving');
}
