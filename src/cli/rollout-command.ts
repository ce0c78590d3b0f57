import { printable } from '../common/terminal-text.js';
import { spawn } from 'node:child_process';
import { Command, Option } from 'commander';
import { addSourceOptions, withClient, type AdminClient, type FleetEntry, type SourceFlags } from './admin-client.js';
import { CliError, EXIT_FAILURE, EXIT_TIMEOUT } from './cli-error.js';
import { K8sError } from '../k8s/k8s-error.js';
import { POLL_INTERVAL_MS, routedOf, servingOf, waitForDrained } from './drain-wait.js';
import { describeWaiting, formatDuration } from './progress-line.js';
import { durationOption, intOption } from './options.js';
import { destination, pino } from 'pino';

interface RolloutFlags extends SourceFlags {
  model?: string;
  k8sSelector?: string;
  namespace?: string;
  deletePods?: boolean;
  kubeconfig?: string;
  maxUnavailable: number;
  thenExec?: string;
  timeout: number;
  drainDeadline?: number;
}

/** One line on stderr; it may quote what a worker reports, so it is shown escaped. */
const say = (line: string) => process.stderr.write(`${printable(line)}\n`);
const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** Runs the per-worker hook through a shell; its output goes to stderr so stdout stays the command's. */
function runHook(cmd: string, worker: FleetEntry, timeoutMs: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, {
      shell: true,
      stdio: ['ignore', 2, 2],
      env: { ...process.env, EBB_WORKER_ID: worker.worker_id, EBB_SYSTEM_URL: worker.system_url, EBB_REQUEST_URL: worker.request_url, EBB_MODEL: worker.model },
    });
    const timer = setTimeout(() => {
      child.kill('SIGTERM');
      reject(new CliError(`--then-exec for worker ${worker.worker_id} did not finish within ${formatDuration(timeoutMs)}; rollout stopped`, EXIT_TIMEOUT));
    }, timeoutMs);
    child.once('error', (err) => {
      clearTimeout(timer);
      reject(new CliError(`--then-exec for worker ${worker.worker_id} could not start: ${err.message}; rollout stopped`));
    });
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      if (code === 0) resolve();
      else reject(new CliError(`--then-exec for worker ${worker.worker_id} exited with ${signal ? `signal ${signal}` : `code ${code}`}; rollout stopped`));
    });
  });
}

/**
 * Polls the fleet until `model` has at least `want` workers in rotation that every frontend routes
 * to (see waitForDrained on polling): a replacement that serves but that some frontend cannot route
 * to yet does not count, so the next worker is never taken out into a gap.
 */
async function waitForServing(client: AdminClient, model: string, want: number, timeoutMs: number): Promise<number> {
  const started = Date.now();
  let have = -1;
  for (;;) {
    have = routedOf(await client.fleet(), model).length;
    if (have >= want) return have;
    const elapsed = Date.now() - started;
    if (elapsed >= timeoutMs)
      throw new CliError(`model ${model} has ${have} serving worker(s) that every frontend routes to, not ${want}, after ${formatDuration(timeoutMs)}; rollout stopped`, EXIT_TIMEOUT);
    await sleep(Math.min(POLL_INTERVAL_MS, timeoutMs - elapsed));
  }
}

/** `--k8s-selector`: the rollout is the pods' own (see k8s/rollout.ts). */
async function rolloutPods(selector: string, flags: RolloutFlags): Promise<void> {
  // Loaded on demand: the Kubernetes client opens dozens of module files, which every other command
  // (and a frontend at a low fd limit) should not pay for.
  const [{ createPodApi, defaultNamespace, loadKubeConfig }, { k8sRollout }] = await Promise.all([import('../k8s/client.js'), import('../k8s/rollout.js')]);
  let kc;
  try {
    kc = loadKubeConfig(flags.kubeconfig);
  } catch (err) {
    throw new CliError(`--k8s-selector: ${(err as Error).message}`);
  }
  const started = Date.now();
  const total = await k8sRollout(
    createPodApi(kc),
    { namespace: flags.namespace ?? defaultNamespace(kc), selector, maxUnavailable: flags.maxUnavailable, deletePods: flags.deletePods === true, timeoutMs: flags.timeout, drainDeadlineMs: flags.drainDeadline, say },
    // Logs go to stderr with the progress lines: stdout is the command's result.
    pino({ level: process.env.EBB_LOG_LEVEL ?? 'warn', base: { component: 'rollout' } }, destination({ dest: 2, sync: true })),
  ).catch((err: unknown) => {
    // k8s/ says whether a wait ran out of time; the exit code is the CLI's to pick.
    if (err instanceof K8sError) throw new CliError(err.message, err.kind === 'timed_out' ? EXIT_TIMEOUT : EXIT_FAILURE);
    throw err;
  });
  process.stdout.write(`rollout of pods ${selector} done: ${total} pod(s) in ${formatDuration(Date.now() - started)}\n`);
}

export function rolloutCommand(): Command {
  return addSourceOptions(
    new Command('rollout').summary('rolling drain of one model, at most --max-unavailable workers at a time').description(
      'rolling drain of one model: drain at most --max-unavailable workers at a time, run a hook on each drained worker ' +
        '(or resume it when there is none), and wait until the model is back to its serving count before the next batch',
    ),
  )
    .option('--model <name>', 'the model whose workers are rolled (required unless --k8s-selector)')
    .option('--k8s-selector <labels>', 'roll Kubernetes pods instead: annotate ebb.dev/drain, wait for ebb.dev/state=drained, delete (--delete-pods) or leave to the controller, wait for the replacement')
    .option('--namespace <ns>', 'with --k8s-selector: the namespace (default: the kubeconfig context\'s, else the service account\'s, else default)')
    .option('--delete-pods', 'with --k8s-selector: delete each drained pod (default: leave it, deletion cost lowest, for its controller)')
    .option('--kubeconfig <path>', 'with --k8s-selector: the kubeconfig (default: in-cluster, else KUBECONFIG or ~/.kube/config)')
    .option('--max-unavailable <n>', 'workers out of rotation at once', intOption(1), 1)
    .option('--then-exec <cmd>', 'shell command run for each drained worker (env EBB_WORKER_ID, EBB_SYSTEM_URL, EBB_REQUEST_URL); non-zero stops the rollout')
    .addOption(new Option('--timeout <duration>', 'bound on each drain, hook and wait for the replacement (exit 2 past it)').argParser(durationOption).default(durationOption('10m'), '10m'))
    .addOption(new Option('--drain-deadline <duration>', 'hand streams still running after this long off to the rest of the fleet (default: wait for them to finish)').argParser(durationOption))
    .action(async (flags: RolloutFlags) => {
      if (flags.k8sSelector !== undefined) {
        await rolloutPods(flags.k8sSelector, flags);
        return;
      }
      const model = flags.model;
      if (model === undefined) throw new CliError('rollout needs --model <name> (or --k8s-selector <labels> to roll Kubernetes pods)');
      await withClient(flags, async (client) => {
        const started = Date.now();
        const initial = servingOf(await client.fleet(), model).sort((a, b) => a.worker_id.localeCompare(b.worker_id));
        if (initial.length === 0) throw new CliError(`no serving worker of model "${model}" in ${client.sourceLabel}`);
        const total = initial.length;
        say(`rollout of ${model}: ${total} worker(s), at most ${flags.maxUnavailable} out of rotation at a time (fleet from ${client.sourceLabel})`);
        let done = 0;
        for (let i = 0; i < initial.length; i += flags.maxUnavailable) {
          // Re-read the fleet: a worker may have left meanwhile, and the batch's target count is
          // what is serving right now (the previous batch waited for it to be whole again).
          const fleet = await client.fleet();
          const serving = servingOf(fleet, model);
          const servingIds = new Set(serving.map((e) => e.worker_id));
          const batch: FleetEntry[] = [];
          for (const w of initial.slice(i, i + flags.maxUnavailable)) {
            if (servingIds.has(w.worker_id)) batch.push(w);
            else say(`[${++done}/${total}] ${w.worker_id}: skipped, no longer serving`);
          }
          if (batch.length === 0) continue;
          const want = serving.length;

          const refs = batch.map((w) => ({ entry: w, ref: client.refFor(w) }));
          const drained = await Promise.allSettled(
            refs.map(async ({ entry, ref }) => {
              say(`[${done + 1 + refs.findIndex((r) => r.entry === entry)}/${total}] ${entry.worker_id}: draining`);
              const t0 = Date.now();
              // persist: false, the drain ends with the process: a hook that restarts the worker under
              // the same id must get a replacement that serves, not one that starts drained.
              let s = await ref.drain({ reason: `ebb rollout ${model}`, persist: false, ...(flags.drainDeadline !== undefined ? { deadline_ms: flags.drainDeadline } : {}) });
              let lastLine = '';
              if (s.state !== 'drained')
                s = await waitForDrained(ref, s.generation, flags.timeout, (st) => {
                  const line = describeWaiting(st);
                  if (line !== lastLine) say(`  ${entry.worker_id}: ${line}`);
                  lastLine = line;
                });
              say(`  ${entry.worker_id}: drained in ${formatDuration(Date.now() - t0)}`);
              return s;
            }),
          );
          const failed = drained.flatMap((r, k) => (r.status === 'rejected' && refs[k] ? [{ entry: (refs[k] as { entry: FleetEntry }).entry, err: r.reason as Error }] : []));
          if (failed.length > 0) {
            // Batch-mates that did drain go back to serving: only the stuck worker stays out.
            for (const [k, r] of drained.entries()) {
              const mate = refs[k];
              if (r.status === 'fulfilled' && mate) await mate.ref.resume().then(() => say(`  ${mate.entry.worker_id}: resumed (batch stopped)`), () => undefined);
            }
            const first = failed[0] as { entry: FleetEntry; err: Error };
            const code = first.err instanceof CliError ? first.err.exitCode : 1;
            throw new CliError(
              `rollout of ${model} stopped at ${first.entry.worker_id}: ${first.err.message}; ` +
                `${done} of ${total} worker(s) were rolled, the others are serving (\`${client.resumeHint(first.entry)}\` puts it back in rotation)`,
              code,
            );
          }

          for (const { entry, ref } of refs) {
            if (flags.thenExec !== undefined) {
              say(`  ${entry.worker_id}: running --then-exec`);
              await runHook(flags.thenExec, entry, flags.timeout);
            } else {
              await ref.resume();
              say(`  ${entry.worker_id}: resumed`);
            }
          }
          const have = await waitForServing(client, model, want, flags.timeout);
          done += batch.length;
          say(`[${done}/${total}] ${model} is back to ${have} serving worker(s)`);
        }
        process.stdout.write(`rollout of ${printable(model)} done: ${total} worker(s) in ${formatDuration(Date.now() - started)}\n`);
      });
    });
}
