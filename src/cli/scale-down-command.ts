import { Command, Option } from 'commander';
import { printable } from '../common/terminal-text.js';
import type { WorkerStatus } from '../common/worker-admin.js';
import { chooseVictims, isChoiceProblem, type Candidate, type RankedWorker } from '../frontend/admin/victim-ranking.js';
import { WORKER_MODES, type WorkerMode } from '../protocol/worker-mode.js';
import { rankingTable, say, type ScaleDownFlags } from './scale-down-output.js';
import { addSourceOptions, withClient, type AdminClient, type FleetEntry } from './admin-client.js';
import { CliError, EXIT_FAILURE } from './cli-error.js';
import { servingOf, waitForDrained } from './drain-wait.js';
import { durationOption, intOption } from './options.js';
import { describeWaiting, formatDuration } from './progress-line.js';

/** The serving workers of `model` as the ranking sees them (their own status reports). */
export function candidatesOf(fleet: FleetEntry[], model: string): Candidate[] {
  return servingOf(fleet, model).flatMap((e) => (e.status ? [{ worker_id: e.worker_id, mode: e.mode, status: e.status }] : []));
}

/** Ranks the model's serving workers and picks `count`; a CliError when there is no such choice. */
export function choose(fleet: FleetEntry[], flags: ScaleDownFlags, model: string, where: string) {
  const choice = chooseVictims(model, candidatesOf(fleet, model), flags.count, flags.pool);
  if (isChoiceProblem(choice)) throw new CliError(`${choice.message} in ${where}${choice.kind === 'pool_needed' ? ' (--pool prefill or --pool decode)' : ''}`);
  return choice;
}

/**
 * Drains the victims, waits (bounded by --timeout) for each to report drained; all or nothing: if
 * any victim fails to drain in time, every victim is resumed and the error says so.
 */
async function drainAll(client: AdminClient, fleet: FleetEntry[], victims: RankedWorker[], flags: ScaleDownFlags, model: string): Promise<Map<string, WorkerStatus>> {
  const byId = new Map(fleet.map((e) => [e.worker_id, e]));
  const refs = victims.map((v) => ({ victim: v, ref: client.refFor(byId.get(v.worker_id) as FleetEntry) }));
  const t0 = Date.now();
  const results = await Promise.allSettled(
    refs.map(async ({ victim, ref }) => {
      say(`${victim.worker_id}: draining (rank ${victim.rank}: ${victim.reason})`);
      // persist: false, the worker is about to be deleted: no intent should outlive it.
      let s = await ref.drain({ reason: `ebb scale-down ${model} by ${flags.count}`, persist: false, ...(flags.drainDeadline !== undefined ? { deadline_ms: flags.drainDeadline } : {}) });
      if (flags.wait && s.state !== 'drained') {
        let last = '';
        s = await waitForDrained(ref, s.generation, flags.timeout, (st) => {
          const line = describeWaiting(st);
          if (line !== last) say(`  ${victim.worker_id}: ${line}`);
          last = line;
        });
      }
      if (s.state === 'drained') say(`  ${victim.worker_id}: drained in ${formatDuration(Date.now() - t0)}`);
      return s;
    }),
  );
  const failed = results.flatMap((r, k) => (r.status === 'rejected' ? [{ id: refs[k]?.victim.worker_id ?? '?', err: r.reason as Error }] : []));
  if (failed.length > 0) {
    // Transactional: the fleet is left as it was. A victim whose drain call failed is resumed too
    // (the call may have reached it); a resume that fails is said, not hidden.
    const unresumed: string[] = [];
    await Promise.all(
      refs.map(async ({ victim, ref }) => {
        try {
          await ref.resume();
          say(`  ${victim.worker_id}: resumed (scale-down rolled back)`);
        } catch (err) {
          unresumed.push(`${victim.worker_id} (${(err as Error).message})`);
        }
      }),
    );
    const first = failed[0] as { id: string; err: Error };
    const code = first.err instanceof CliError ? first.err.exitCode : EXIT_FAILURE;
    throw new CliError(
      `scale-down of ${model} rolled back: ${first.err.message}; ` +
        (unresumed.length === 0 ? 'every victim was resumed and nothing is to be deleted' : `could not resume ${unresumed.join(', ')}: resume by hand`),
      code,
    );
  }
  return new Map(results.map((r, k) => [refs[k]?.victim.worker_id ?? '', (r as PromiseFulfilledResult<WorkerStatus>).value]));
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
          'All or nothing: a victim that does not drain within --timeout is resumed with the others, exit 2.',
      ),
  )
    .option('--model <name>', 'the model to scale down (required)')
    .requiredOption('--count <n>', 'how many workers to remove', intOption(1))
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
      if (flags.k8sScale !== undefined && flags.k8sSelector === undefined) throw new CliError('--k8s-scale goes with --k8s-selector');
      if (flags.k8sSelector !== undefined) {
        const { scaleDownPods } = await import('./scale-down-k8s.js');
        await scaleDownPods(flags.k8sSelector, flags, model);
        return;
      }
      await withClient(flags, async (client) => {
        const fleet = await client.fleet();
        const { pool, ranking, victims } = choose(fleet, flags, model, client.sourceLabel);
        const report = { model, pool, count: flags.count, dry_run: flags.dryRun === true, victims, ranking };
        if (flags.dryRun) {
          process.stdout.write(flags.json ? `${JSON.stringify(report, null, 2)}\n` : `scale-down of ${printable(model)} (${pool}) by ${flags.count} would take:\n${printable(rankingTable(ranking, flags.count))}\n`);
          return;
        }
        say(`scale-down of ${model} (${pool}) by ${flags.count}: ${victims.map((v) => v.worker_id).join(', ')} (fleet from ${client.sourceLabel})`);
        const started = Date.now();
        const states = await drainAll(client, fleet, victims, flags, model);
        const out = { ...report, victims: victims.map((v) => ({ ...v, state: states.get(v.worker_id)?.state ?? null })) };
        if (flags.json) process.stdout.write(`${JSON.stringify(out, null, 2)}\n`);
        else if (flags.wait)
          process.stdout.write(`scale-down of ${printable(model)} by ${flags.count}: ${printable(victims.map((v) => v.worker_id).join(', '))} drained in ${formatDuration(Date.now() - started)}, ready to delete\n`);
        else process.stdout.write(`scale-down of ${printable(model)} by ${flags.count}: draining ${printable(victims.map((v) => v.worker_id).join(', '))} (\`ebb workers\` follows them; --wait waits for them)\n`);
      });
    });
}
