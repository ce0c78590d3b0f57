import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import type { Admission } from '../lifecycle/admission.js';
import { ENGINE_ACTOR, SIGNAL_ACTOR } from '../lifecycle/audit.js';
import type { Lifecycle } from '../lifecycle/lifecycle.js';
import type { WorkerMetrics } from './metrics.js';
import { ShutdownBudget } from './shutdown-budget.js';
import type { StageName, StageOutcome } from './shutdown-stages.js';

export type { StageName, StageOutcome };

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
export const CANCELLED_EXIT_CODE = 130;
/** The engine died under the worker: its supervisor should restart it. */
export const ENGINE_FAILED_EXIT_CODE = 1;
/**
 * What the last stages get of the watchdog margin: handing off or cutting streams at most
 * FINAL_STAGE_CAP_MS each, and never what cleanup reserves; cleanup (servers closed, connections
 * still open then dropped) CLEANUP_RESERVE_MS, less when the budget is nearly spent, and always
 * ending WATCHDOG_SLACK_MS before the watchdog. An engine child stopped in cleanup (--engine-cmd)
 * runs on in the margin, which is sized for it.
 */
export const CLEANUP_RESERVE_MS = 2000;
export const FINAL_STAGE_CAP_MS = 2000;
export const WATCHDOG_SLACK_MS = 250;
/**
 * The unregister stage's share of the budget while discovery does not answer: the lease dies with
 * the process anyway, and the admitted work must keep its time to finish.
 */
export const UNREGISTER_CAP_MS = 5000;

export interface StageResult {
  stage: StageName;
  outcome: StageOutcome;
  seconds: number;
}

export interface ShutdownDeps {
  lifecycle: Lifecycle;
  admission: Admission;
  metrics: WorkerMetrics;
  log: Logger;
  /** Ends every stream still running with a terminal `worker_shut_down` line; resolves once they are released. */
  cutInflight: (signal: AbortSignal) => Promise<void>;
  /** Hands every running generation off to other workers (a terminal hand-off line); `closed` once released. */
  handOffInflight: () => { count: number; closed: Promise<void> };
  /** Closes servers, discovery and the engine; must drop what is still open when `signal` aborts. */
  cleanup: (signal: AbortSignal) => Promise<void>;
  exit: (code: number) => void;
  /** A second signal: the stage under way is cancelled, and so is every later one but cleanup. */
  cancel: AbortSignal;
}

class StageTimeout extends Error {}

/** Why the worker goes down: a signal (drain first), or its engine died (nothing can finish). */
export type ShutdownCause = { signal: string } | { engineFailure: string };

/** Stages that run even after a cancel: what is in flight is always ended explicitly, and servers closed. */
const FINAL_STAGES: ReadonlySet<StageName> = new Set(['cut_inflight', 'cleanup']);

/**
 * SIGTERM runs the same drain as the Admin API, as stages under one budget measured from the
 * signal (grace + drain timeout + watchdog margin; see ShutdownBudget): unregister, router grace, wait for in-flight work, hand off what still runs at the
 * deadline (the frontend continues it elsewhere: nothing is lost, so the exit is still 0), cut only
 * what could not be handed off, cleanup. Each stage gets what is left of the budget, ends with a typed outcome, and is recorded.
 */
export async function runShutdown(cause: ShutdownCause, opts: ShutdownOptions, deps: ShutdownDeps): Promise<number> {
  const { lifecycle, admission, metrics, log } = deps;
  const started = performance.now();
  const failure = 'engineFailure' in cause ? cause.engineFailure : undefined;
  const reason = failure === undefined ? `signal ${(cause as { signal: string }).signal}` : `engine failed: ${failure}`;
  // One budget from the signal: grace and drain timeout for the work, the margin for the last stages.
  // An engine failure has no work to wait for: only the unregister and the last stages.
  const workMs = failure === undefined ? opts.graceMs + opts.drainTimeoutMs : UNREGISTER_CAP_MS;
  const budget = new ShutdownBudget(started, workMs + opts.watchdogMarginMs);
  const margin = opts.watchdogMarginMs;
  const watchdog = setTimeout(() => {
    log.fatal({ event: 'shutdown_watchdog', inflight: admission.inflightIds() }, 'shutdown exceeded its budget; exiting');
    deps.exit(WATCHDOG_EXIT_CODE);
  }, budget.totalMs);
  watchdog.unref();

  const wasDrained = lifecycle.state === 'drained';
  // The deadline as planned; the grace is skipped (and the deadline earlier) when nothing is registered.
  if (failure === undefined) lifecycle.beginShutdown(reason, Date.now() + opts.graceMs + opts.drainTimeoutMs);
  else lifecycle.engineFailed(failure);
  log.info({ event: 'shutdown_started', ...('signal' in cause ? { signal: cause.signal } : { engine_failed: failure }), already_drained: wasDrained, inflight: admission.inflight }, 'shutdown started');
  const results: StageResult[] = [];

  /** Runs one stage with `ms` of budget (undefined: no bound but the cancel signal). */
  const stage = async (name: StageName, ms: number | undefined, run: (signal: AbortSignal) => Promise<StageOutcome>): Promise<StageOutcome> => {
    const t = performance.now();
    let outcome: StageOutcome;
    if (deps.cancel.aborted && !FINAL_STAGES.has(name)) outcome = 'cancelled';
    else {
      const bound = ms === undefined ? undefined : AbortSignal.timeout(Math.max(0, Math.floor(ms)));
      const signals = [bound, FINAL_STAGES.has(name) ? undefined : deps.cancel].filter((s): s is AbortSignal => s !== undefined);
      const stageSignal = signals.length > 0 ? AbortSignal.any(signals) : new AbortController().signal;
      try {
        outcome = await run(stageSignal);
        if (outcome === 'timed_out' && deps.cancel.aborted && !FINAL_STAGES.has(name)) outcome = 'cancelled';
      } catch (err) {
        if (deps.cancel.aborted && !FINAL_STAGES.has(name)) outcome = 'cancelled';
        else if (bound?.aborted || err instanceof StageTimeout) outcome = 'timed_out';
        else throw err;
      }
    }
    const seconds = (performance.now() - t) / 1000;
    results.push({ stage: name, outcome, seconds });
    metrics.shutdownStage(name, outcome, seconds);
    log.info({ event: 'shutdown_stage', stage: name, outcome, seconds }, `shutdown stage ${name}: ${outcome}`);
    return outcome;
  };

  // The work's stages never eat the margin: it is what the last stages (hand-off, cut, cleanup) run in.
  const unregistered = await stage('unregister', budget.stageMs(UNREGISTER_CAP_MS, margin), (s) => lifecycle.unregisterForShutdown(s));
  // Routers converge on their own clock: a fixed wait, and none when we were not listed anyway.
  const graceSkipped = unregistered === 'skipped' || failure !== undefined;
  const graceMs = graceSkipped ? 0 : budget.stageMs(opts.graceMs, margin);
  await stage('grace', graceMs, async (s) => {
    if (graceSkipped) return 'skipped';
    await sleep(graceMs, undefined, { signal: s }).catch(() => {
      if (deps.cancel.aborted) throw new Error('cancelled');
    });
    return 'completed';
  });

  // The planned deadline (shown in status), or earlier when the stages before ran into the margin.
  const deadline = Math.min(started + (graceSkipped ? 0 : opts.graceMs) + opts.drainTimeoutMs, budget.endsAt - margin);
  const waited = await stage('wait_inflight', deadline - performance.now(), async (s) => {
    if (failure !== undefined) return 'skipped'; // a dead engine finishes nothing
    try {
      await lifecycle.whenQuiescent(s);
      return 'completed';
    } catch (err) {
      if (deps.cancel.aborted) throw err;
      // Nothing in flight but the engine could not say it is idle: fail-closed, reported as such.
      return admission.inflight === 0 && lifecycle.lastQuiescence?.state === 'unknown' ? 'unsupported' : 'timed_out';
    }
  });

  let code = 0;
  let handedOff: StageOutcome = 'skipped';
  if (waited !== 'completed' && failure === undefined && !deps.cancel.aborted) {
    handedOff = await stage('handoff', budget.stageMs(FINAL_STAGE_CAP_MS, CLEANUP_RESERVE_MS), async (s) => {
      const { count, closed } = deps.handOffInflight();
      if (count === 0) return 'skipped'; // nothing to hand off: the wait was for the engine, not streams
      log.info({ event: 'shutdown_handoff', count }, `drain deadline reached: handing off ${count} stream(s) to other workers`);
      await closed;
      await lifecycle.whenQuiescent(s);
      return 'completed';
    });
  } else await stage('handoff', 0, async () => 'skipped');

  if (waited !== 'completed' && handedOff !== 'completed') {
    code = failure !== undefined ? ENGINE_FAILED_EXIT_CODE : deps.cancel.aborted ? CANCELLED_EXIT_CODE : DEADLINE_EXIT_CODE;
    const status = lifecycle.status();
    log.error(
      { event: 'shutdown_deadline', inflight: admission.inflightIds(), waiting_for: status.waiting_for, outcome: waited },
      `drain ${waited === 'cancelled' ? 'cancelled' : 'deadline reached'} with ${admission.inflight} request(s) in flight (${status.waiting_for.join('; ') || 'engine not idle'}); cutting off`,
    );
    await stage('cut_inflight', budget.stageMs(FINAL_STAGE_CAP_MS, CLEANUP_RESERVE_MS), async (s) => {
      await deps.cutInflight(s);
      return 'completed';
    });
  } else await stage('cut_inflight', 0, async () => 'skipped');

  // Audited before cleanup closes the system server, so its status stream still carries the event.
  lifecycle.audit.record({
    what: 'shutdown',
    reason,
    actor: failure === undefined ? SIGNAL_ACTOR : ENGINE_ACTOR,
    generation: lifecycle.status().generation,
    result:
      failure !== undefined ? 'engine failed (cut)'
      : code === 0 ? (handedOff === 'completed' ? 'completed (handed off)' : 'completed')
      : waited === 'cancelled' || deps.cancel.aborted ? 'cancelled'
      : 'deadline (cut)',
    detail: { exit_code: code, stages: results.map((r) => `${r.stage}:${r.outcome}`) },
    startedAt: started,
  });
  await stage('cleanup', budget.stageMs(CLEANUP_RESERVE_MS, WATCHDOG_SLACK_MS), async (s) => {
    await deps.cleanup(s);
    if (s.aborted) throw new StageTimeout();
    return 'completed';
  });
  lifecycle.stopped();
  clearTimeout(watchdog);
  log.info({ event: 'shutdown_complete', exit_code: code, seconds: (performance.now() - started) / 1000, stages: results }, 'shutdown complete');
  return code;
}
