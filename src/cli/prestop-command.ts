import { printable } from '../common/terminal-text.js';
import { Command, Option } from 'commander';
import { withClient } from './admin-client.js';
import { CliError, EXIT_TIMEOUT } from './cli-error.js';
import { waitForDrained } from './drain-wait.js';
import { describeWaiting, formatDuration } from './progress-line.js';
import { durationOption } from './options.js';

interface PrestopFlags {
  systemUrl: string;
  timeout: number;
  deadline?: number;
  reason: string;
  tokenFile?: string;
  adminTokenFile?: string;
}

/** One line on stderr; it may quote what a worker reports, so it is shown escaped. */
const say = (line: string) => process.stderr.write(`${printable(line)}\n`);

/**
 * A container preStop exec hook: drain the worker in this pod through its local Admin API and
 * return once it is drained, so the kubelet's SIGTERM finds nothing in flight. The kubelet's grace
 * countdown (terminationGracePeriodSeconds) starts before the hook runs, so --timeout must leave
 * room for the shutdown after it (see docs/kubernetes.md, "Workers and their pods").
 */
export function prestopCommand(): Command {
  return new Command('prestop')
    .description('preStop hook: drain the local worker and return once it is drained (or at --timeout)')
    .addOption(new Option('--system-url <url>', "the worker's system-status server").default(process.env.EBB_SYSTEM_URL ?? 'http://127.0.0.1:9090', 'env EBB_SYSTEM_URL, else http://127.0.0.1:9090'))
    .addOption(new Option('--timeout <duration>', 'return after this long even if not drained (exit 2); SIGTERM then hands off what still runs').argParser(durationOption).default(durationOption('5m'), '5m'))
    .addOption(new Option('--deadline <duration>', 'hand streams still running after this long off to other workers').argParser(durationOption))
    .option('--reason <text>', 'recorded by the worker as drain_reason', 'preStop hook')
    .option('--token-file <path>', 'file holding the admin bearer token (env EBB_ADMIN_TOKEN)')
    .addOption(new Option('--admin-token-file <path>', 'the same as --token-file').hideHelp().conflicts('tokenFile'))
    .action(async (flags: PrestopFlags) => {
      await withClient({ tokenFile: flags.tokenFile ?? flags.adminTokenFile }, async (client) => {
        const started = Date.now();
        const ref = await client.resolve(flags.systemUrl);
        let status;
        try {
          // persist: false, the first half of this container's termination, as a SIGTERM is: no
          // drain intent, so a worker restarted under the same id (StatefulSet, systemd) serves.
          status = await ref.drain({ reason: flags.reason, persist: false, ...(flags.deadline !== undefined ? { deadline_ms: flags.deadline } : {}) });
        } catch (err) {
          // Already shutting down (a SIGTERM came first): that shutdown drains; nothing to add.
          if (err instanceof CliError && /shutting down/.test(err.message)) {
            say(`prestop: ${ref.label} is already shutting down`);
            return;
          }
          throw err;
        }
        let last = '';
        if (status.state !== 'drained')
          status = await waitForDrained(ref, status.generation, flags.timeout, (s) => {
            const line = describeWaiting(s);
            if (line !== last) say(`prestop: ${line}`);
            last = line;
          }).catch((err: unknown) => {
            if (err instanceof CliError && err.exitCode === EXIT_TIMEOUT) throw new CliError(`prestop: ${err.message}; the SIGTERM that follows hands off what still runs`, EXIT_TIMEOUT);
            throw err;
          });
        process.stdout.write(`worker ${printable(status.worker_id)} drained in ${formatDuration(Date.now() - started)}\n`);
      });
    });
}
