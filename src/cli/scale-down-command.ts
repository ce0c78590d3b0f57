import { Command, Option } from 'commander';
import { printable } from '../common/terminal-text.js';
import { errorMessageOf } from '../common/worker-admin.js';
import { servingCandidates, unansweredWorkers } from '../frontend/admin/fleet-capacity.js';
import { chooseVictims, isChoiceProblem, type RankedWorker } from '../frontend/admin/victim-ranking.js';
import { WORKER_MODES, type WorkerMode } from '../protocol/worker-mode.js';
import { rankingTable, say, type ScaleDownFlags } from './scale-down-output.js';
import { addSourceOptions, AdminClient, withClient, type FleetEntry, type WorkerRef } from './admin-client.js';
import { CliError, EXIT_FAILURE, EXIT_INTERRUPTED } from './cli-error.js';
import { waitForDrained } from './drain-wait.js';
import { durationOption, intOption } from './options.js';
import { describeWaiting, formatDuration } from './progress-line.js';

/**
 * Ranks the model's serving workers and picks `count` (or exactly --workers); a CliError when there
 * is no such choice, or when a worker of the model did not answer its status (the ranking would
 * silently pass it over).
 */
export function choose(fleet: FleetEntry[], flags: ScaleDownFlags, model: string, where: string) {
  const choice = chooseVictims(model, servingCandidates(fleet, model), flags.count, flags.pool, { named: flags.workers, unanswered: unansweredWorkers(fleet, model) });
  if (isChoiceProblem(choice)) throw new CliError(`${choice.message} in ${where}${choice.kind === 'pool_needed' ? ' (--pool prefill or --pool decode)' : ''}`);
  return choice;
}

/** A victim being drained: how to reach it, and the generation its drain answered with (what --wait pins). */
interface Draining {
  victim: RankedWorker;
  entry: FleetEntry;
  ref: WorkerRef;
  answer?: { state: string; generation: number };
}

/**
 * SIGINT or SIGTERM while the victims are chosen, drained or waited for: the scale-down rolls back
 * (its signal aborts with a CliError). Once only: a second signal gets the default (the process ends).
 */
function onInterrupt(stop: AbortController): () => void {
  const handler = (sig: NodeJS.Signals) => {
    say(`${sig}: rolling back the scale-down (${sig} again to leave the victims as they are)`);
    stop.abort(new CliError(`interrupted by ${sig}`, EXIT_INTERRUPTED));
  };
  process.once('SIGINT', handler);
  process.once('SIGTERM', handler);
  return () => {
    process.off('SIGINT', handler);
    process.off('SIGTERM', handler);
  };
}

/**
 * Puts every victim back in rotation: through the source, and where that fails (a frontend that
 * is gone), at the worker's own system URL. Resuming a serving worker is a no-op. The ids that
 * could not be resumed, with why.
 */
async function rollBack(client: AdminClient, drains: Draining[]): Promise<string[]> {
  const unresumed: string[] = [];
  await Promise.all(
    drains.map(async ({ victim, entry, ref }) => {
      try {
        await ref.resume();
        say(`  ${victim.worker_id}: resumed (scale-down rolled back)`);
      } catch (err) {
        if (client.source.kind !== 'frontend') return void unresumed.push(`${victim.worker_id} (${(err as Error).message})`);
        try {
          await client.systemRef(entry).resume();
          say(`  ${victim.worker_id}: resumed at its own system URL ${entry.system_url} (scale-down rolled back; the frontend: ${(err as Error).message})`);
        } catch (direct) {
          unresumed.push(`${victim.worker_id} (${(direct as Error).message})`);
        }
      }
    }),
  );
  return unresumed;
}

/** Rolls back and throws the CliError that says why and how it went: a scale-down is all or nothing. */
async function failWhole(client: AdminClient, drains: Draining[], model: string, cause: Error): Promise<never> {
  const unresumed = await rollBack(client, drains);
  const code = cause instanceof CliError ? cause.exitCode : EXIT_FAILURE;
  throw new CliError(
    `scale-down of ${model} rolled back: ${cause.message}; ` +
      (unresumed.length === 0 ? 'every victim was resumed and nothing is to be deleted' : `could not resume ${unresumed.join(', ')}: resume by hand`),
    code,
  );
}

/**
 * Chooses and drains the victims, under discovery's scale-down lock of the model (so the next
 * scale-down, from any CLI or frontend, ranks what is still serving); a refused drain rolls back.
 */
async function drainUnderLock(client: AdminClient, flags: ScaleDownFlags, model: string, stop: AbortSignal) {
  const release = await client.scaleDownLock(model);
  try {
    const fleet = await client.fleet(AdminClient.CALL_TIMEOUT_MS);
    const choice = choose(fleet, flags, model, client.sourceLabel);
    const byId = new Map(fleet.map((e) => [e.worker_id, e]));
    const drains: Draining[] = choice.victims.map((victim) => {
      const entry = byId.get(victim.worker_id) as FleetEntry;
      return { victim, entry, ref: client.refFor(entry) };
    });
    say(`scale-down of ${model} (${choice.pool}) by ${flags.count}: ${choice.victims.map((v) => v.worker_id).join(', ')} (fleet from ${client.sourceLabel})`);
    const results = await Promise.allSettled(
      drains.map(async (d) => {
        say(`${d.victim.worker_id}: draining (rank ${d.victim.rank}: ${d.victim.reason})`);
        // persist: false, the worker is about to be deleted: no intent should outlive it.
        d.answer = await d.ref.drain({ reason: `ebb scale-down ${model} by ${flags.count}`, persist: false, ...(flags.drainDeadline !== undefined ? { deadline_ms: flags.drainDeadline } : {}) });
      }),
    );
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    // A victim whose drain call failed is resumed too (the call may have reached it).
    if (failed !== undefined || stop.aborted) await failWhole(client, drains, model, (failed?.reason as Error | undefined) ?? (stop.reason as Error));
    return { ...choice, drains };
  } finally {
    await release();
  }
}

/**
 * POST /models/{model}/scale-down: the frontend chooses (and, unless a dry run, drains) under its
 * lock, which is discovery's (409 while another scale-down of the model is under way); its
 * ebb_frontend_scale_downs_total counts it, dry runs too.
 */
async function askFrontend(client: AdminClient, flags: ScaleDownFlags, model: string, url: string, dryRun: boolean) {
  const body = { count: flags.count, ...(flags.pool ? { pool: flags.pool } : {}), ...(flags.drainDeadline !== undefined ? { deadline_ms: flags.drainDeadline } : {}), ...(flags.workers ? { workers: flags.workers } : {}), ...(dryRun ? { dry_run: true } : {}) };
  const res = await client.call<{ pool: WorkerMode; ranking: RankedWorker[]; victims: Array<RankedWorker & { state: string | null; generation: number | null }> }>(
    `${url}/models/${encodeURIComponent(model)}/scale-down`,
    'POST',
    client.sourceLabel,
    body,
  );
  if (res.statusCode !== (dryRun ? 200 : 202)) throw new CliError(`${client.sourceLabel} refused the scale-down of ${model}: HTTP ${res.statusCode}: ${errorMessageOf(res.body)}`);
  return res.body;
}

/** The frontend chooses and drains; this follows the victims it names. */
async function drainThroughFrontend(client: AdminClient, flags: ScaleDownFlags, model: string, url: string, stop: AbortSignal) {
  const { pool, ranking, victims } = await askFrontend(client, flags, model, url, false);
  say(`scale-down of ${model} (${pool}) by ${flags.count}: ${victims.map((v) => v.worker_id).join(', ')} (chosen and drained by ${client.sourceLabel})`);
  const fleet = await client.fleet();
  const drains: Draining[] = victims.flatMap((v) => {
    const entry = fleet.find((e) => e.worker_id === v.worker_id);
    if (entry === undefined) return [];
    say(`${v.worker_id}: draining (rank ${v.rank}: ${v.reason})`);
    return [{ victim: v, entry, ref: client.refFor(entry), ...(v.state !== null && v.generation !== null ? { answer: { state: v.state, generation: v.generation } } : {}) }];
  });
  if (stop.aborted || drains.length < victims.length || drains.some((d) => d.answer === undefined))
    await failWhole(client, drains, model, stop.aborted ? (stop.reason as Error) : new CliError(`a victim went missing from ${client.sourceLabel} as it was drained`));
  return { pool, ranking, victims, drains };
}

/**
 * Waits (bounded by --timeout) for each victim to report drained at the generation its drain
 * answered with; all or nothing: the first that fails (a timeout, another generation, a source
 * that stops answering, an interrupt) stops the others, and every victim is resumed.
 */
async function waitDrained(client: AdminClient, drains: Draining[], flags: ScaleDownFlags, model: string, stop: AbortController): Promise<Map<string, string>> {
  const t0 = Date.now();
  const results = await Promise.allSettled(
    drains.map(async ({ victim, ref, answer }) => {
      let s = answer as { state: string; generation: number };
      if (s.state !== 'drained') {
        let last = '';
        s = await waitForDrained(
          ref,
          s.generation,
          flags.timeout,
          (st) => {
            const line = describeWaiting(st);
            if (line !== last) say(`  ${victim.worker_id}: ${line}`);
            last = line;
          },
          stop.signal,
        ).catch((err: Error) => {
          if (!stop.signal.aborted) stop.abort(err);
          throw err;
        });
      }
      say(`  ${victim.worker_id}: drained in ${formatDuration(Date.now() - t0)}`);
      return s.state;
    }),
  );
  if (results.some((r) => r.status === 'rejected')) await failWhole(client, drains, model, stop.signal.reason as Error);
  return new Map(results.map((r, k) => [drains[k]?.victim.worker_id ?? '', (r as PromiseFulfilledResult<string>).value]));
}

function workersOption(value: string): string[] {
  const ids = value.split(',').map((s) => s.trim()).filter((s) => s !== '');
  if (ids.length === 0 || new Set(ids).size !== ids.length) throw new CliError(`--workers expects distinct worker ids separated by commas, got "${value}"`);
  return ids;
}

function poolOption(value: string): WorkerMode {
  if (!(WORKER_MODES as readonly string[]).includes(value)) throw new CliError(`--pool expects one of ${WORKER_MODES.join(', ')}, got "${value}"`);
  return value as WorkerMode;
}

export function scaleDownCommand(): Command {
  return addSourceOptions(
    new Command('scale-down')
      .summary("drain the --count workers of a model whose drain costs least, for deletion")
      .description(
        'choose --count serving workers of --model (least work to wait for, then least cache value, then youngest; ' +
          'prefill and decode pools ranked apart), drain them, and with --wait report them once drained and deletable. ' +
          'All or nothing: a victim that does not drain within --timeout is resumed with the others, exit 2; Ctrl-C resumes them too (exit 130). ' +
          'One scale-down of a model at a time, across CLIs and frontends (a lock in discovery).',
      ),
  )
    .option('--model <name>', 'the model to scale down (required)')
    .option('--count <n>', 'how many workers to remove (or --workers)', intOption(1))
    .addOption(new Option('--workers <ids>', 'drain exactly these (comma-separated: the victims a --dry-run named); refused if one is no longer serving').argParser(workersOption))
    .addOption(new Option('--pool <mode>', 'the pool to scale down when the model has several (prefill, decode)').argParser(poolOption))
    .option('--dry-run', 'print the ranking and the victims it would take; drain nothing')
    .option('--wait', 'wait until every victim is drained (always, with --k8s-selector)')
    .addOption(new Option('--timeout <duration>', 'with --wait: bound on the drains; past it every victim is resumed (exit 2)').argParser(durationOption).default(durationOption('10m'), '10m'))
    .addOption(new Option('--drain-deadline <duration>', 'hand streams still running after this long off to the workers that stay (default: wait for them to finish)').argParser(durationOption))
    .option('--json', 'print one JSON object: {model, pool, victims: [{worker_id, reason, ...}], ranking}')
    .option('--k8s-selector <labels>', "choose among these pods (a Deployment's): drain through the ebb.dev/drain annotation, then delete them (or --k8s-scale)")
    .option('--k8s-scale <deployment/NAME>', 'with --k8s-selector: leave the drained pods at the lowest deletion cost and scale this Deployment down by --count')
    .option('--namespace <ns>', "with --k8s-selector: the namespace (default: the kubeconfig context's, else the service account's, else default)")
    .option('--kubeconfig <path>', 'with --k8s-selector: the kubeconfig (default: in-cluster, else KUBECONFIG or ~/.kube/config)')
    .action(async (flags: ScaleDownFlags) => {
      const model = flags.model;
      if (model === undefined) throw new CliError('scale-down needs --model <name>');
      if (flags.workers !== undefined) {
        if (flags.count !== undefined && flags.count !== flags.workers.length) throw new CliError(`--count ${flags.count} and --workers naming ${flags.workers.length}: give one of them`);
        flags.count = flags.workers.length;
      }
      if (flags.count === undefined) throw new CliError('scale-down needs --count <n> or --workers <ids>');
      if (flags.k8sScale !== undefined && flags.k8sSelector === undefined) throw new CliError('--k8s-scale goes with --k8s-selector');
      if (flags.k8sSelector !== undefined) {
        const { scaleDownPods } = await import('./scale-down-k8s.js');
        await scaleDownPods(flags.k8sSelector, flags, model);
        return;
      }
      await withClient(flags, async (client) => {
        if (flags.dryRun) {
          const { pool, ranking, victims } = client.source.kind === 'frontend' ? await askFrontend(client, flags, model, client.source.url, true) : choose(await client.fleet(AdminClient.CALL_TIMEOUT_MS), flags, model, client.sourceLabel);
          const report = { model, pool, count: flags.count, dry_run: true, victims, ranking };
          const again = `ebb scale-down --model ${model} --workers ${victims.map((v) => v.worker_id).join(',')}`;
          process.stdout.write(
            flags.json ? `${JSON.stringify(report, null, 2)}\n` : `scale-down of ${printable(model)} (${pool}) by ${flags.count} would take:\n${rankingTable(ranking, victims)}\nto drain exactly these: ${printable(again)}\n`,
          );
          return;
        }
        const stop = new AbortController();
        const uninstall = onInterrupt(stop);
        try {
          const started = Date.now();
          const { pool, ranking, victims, drains } = client.source.kind === 'frontend' ? await drainThroughFrontend(client, flags, model, client.source.url, stop.signal) : await drainUnderLock(client, flags, model, stop.signal);
          const states = flags.wait ? await waitDrained(client, drains, flags, model, stop) : new Map(drains.map((d) => [d.victim.worker_id, d.answer?.state ?? null]));
          const report = { model, pool, count: flags.count, dry_run: false, victims: victims.map((v) => ({ ...v, state: states.get(v.worker_id) ?? null })), ranking };
          const ids = printable(victims.map((v) => v.worker_id).join(', '));
          if (flags.json) process.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
          else if (flags.wait) process.stdout.write(`scale-down of ${printable(model)} by ${flags.count}: ${ids} drained in ${formatDuration(Date.now() - started)}, ready to delete\n`);
          else process.stdout.write(`scale-down of ${printable(model)} by ${flags.count}: draining ${ids} (\`ebb workers\` follows them; --wait waits for them)\n`);
        } finally {
          uninstall();
        }
      });
    });
}
