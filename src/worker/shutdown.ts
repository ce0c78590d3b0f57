import type { Logger } from 'pino';
import type { Admission } from '../lifecycle/admission.js';
import type { Lifecycle } from '../lifecycle/lifecycle.js';
import type { WorkerMetrics } from './metrics.js';

export interface ShutdownOptions {
  /** Routing convergence: how long refusals keep being answered before the wait for in-flight work. */
  graceMs: number;
  /** How long admitted work may still run after the grace. */
  drainTimeoutMs: number;
  /** Past grace + drain timeout + this margin, the watchdog exits with WATCHDOG_EXIT_CODE. */
  watchdogMarginMs: number;
}

/** Distinct from 0 and 1 so a hung shutdown is never mistaken for a clean or a cut-off one. */
export const WATCHDOG_EXIT_CODE = 70;
export const DEADLINE_EXIT_CODE = 1;

export interface ShutdownDeps {
  lifecycle: Lifecycle;
  admission: Admission;
  metrics: WorkerMetrics;
  log: Logger;
  /** Closes servers and discovery; `force` drops connections still open after a missed deadline. */
  cleanup: (force: boolean) => Promise<void>;
  exit: (code: number) => void;
}

function wait(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));
}

/**
 * SIGTERM runs the same drain as the Admin API, under one budget measured from the signal:
 * drain (admission closed, unregistered), router grace, wait for drained, cleanup.
 */
export async function runShutdown(signal: string, opts: ShutdownOptions, deps: ShutdownDeps): Promise<number> {
  const { lifecycle, admission, metrics, log } = deps;
  const started = performance.now();
  const elapsed = () => (performance.now() - started) / 1000;
  const watchdog = setTimeout(() => {
    log.fatal({ event: 'shutdown_watchdog', inflight: admission.inflightIds() }, 'shutdown exceeded its budget; exiting');
    deps.exit(WATCHDOG_EXIT_CODE);
  }, opts.graceMs + opts.drainTimeoutMs + opts.watchdogMarginMs);
  watchdog.unref();

  // An Admin drain already took the worker out of discovery: nothing left for routers to converge on.
  const alreadyOut = lifecycle.state !== 'serving';
  lifecycle.beginShutdown();
  log.info({ event: 'shutdown_started', signal, already_drained: lifecycle.state === 'drained', inflight: admission.inflight }, 'shutdown started');

  let t = performance.now();
  await lifecycle.drain(`signal ${signal}`, { rollbackOnFailure: false });
  metrics.shutdownStage('unregister', alreadyOut ? 'skipped' : 'completed', (performance.now() - t) / 1000);

  t = performance.now();
  if (alreadyOut) metrics.shutdownStage('grace', 'skipped', 0);
  else {
    // A fixed wait on purpose: other routers' caches converge on their own clock, not on one of our events.
    await wait(opts.graceMs);
    metrics.shutdownStage('grace', 'completed', (performance.now() - t) / 1000);
  }

  t = performance.now();
  const budget = opts.graceMs + opts.drainTimeoutMs - (performance.now() - started);
  let code = 0;
  try {
    await lifecycle.whenDrained(AbortSignal.timeout(Math.max(0, Math.floor(alreadyOut ? opts.drainTimeoutMs : budget))));
    metrics.shutdownStage('wait_inflight', 'completed', (performance.now() - t) / 1000);
  } catch {
    code = DEADLINE_EXIT_CODE;
    metrics.shutdownStage('wait_inflight', 'timed_out', (performance.now() - t) / 1000);
    const status = lifecycle.status();
    log.error(
      { event: 'shutdown_deadline', inflight: admission.inflightIds(), waiting_for: status.waiting_for },
      `drain deadline reached with ${admission.inflight} request(s) in flight (${status.waiting_for.join('; ') || 'engine not idle'}); cutting off`,
    );
  }

  t = performance.now();
  await deps.cleanup(code !== 0);
  metrics.shutdownStage('cleanup', 'completed', (performance.now() - t) / 1000);
  clearTimeout(watchdog);
  log.info({ event: 'shutdown_complete', exit_code: code, seconds: elapsed() }, 'shutdown complete');
  return code;
}
