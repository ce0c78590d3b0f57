import { printable } from '../common/terminal-text.js';
import { Command, Option } from 'commander';
import { addSourceOptions, withClient, WORKER_ARGUMENT, type SourceFlags } from './admin-client.js';
import { waitForDrained } from './drain-wait.js';
import { describeEta, describeWaiting, formatDuration, ProgressLine } from './progress-line.js';
import { durationOption } from './options.js';
import { summarize } from './status-command.js';

interface DrainFlags extends SourceFlags {
  wait?: boolean;
  timeout: number;
  reason: string;
  deadline?: number;
  json?: boolean;
}

export function drainCommand(): Command {
  return addSourceOptions(
    new Command('drain')
      .description('drain a worker: it stops admitting, leaves discovery, and finishes what it admitted')
      .argument('<worker>', WORKER_ARGUMENT),
  )
    .option('--wait', 'follow the drain until the worker is drained (progress on stderr)')
    .addOption(new Option('--timeout <duration>', 'with --wait: give up after this long (exit 2); the drain itself goes on').argParser(durationOption).default(durationOption('10m'), '10m'))
    .option('--reason <text>', 'recorded by the worker as drain_reason', 'ebb drain')
    .addOption(new Option('--deadline <duration>', 'hand streams still running after this long off to other workers of the model (default: wait for them to finish)').argParser(durationOption))
    .option('--json', 'print the final status as JSON')
    .action(async (target: string, flags: DrainFlags) => {
      await withClient(flags, async (client) => {
        const ref = await client.resolve(target);
        const started = Date.now();
        let status = await ref.drain({ reason: flags.reason, ...(flags.deadline !== undefined ? { deadline_ms: flags.deadline } : {}) });
        if (flags.wait && status.state !== 'drained') {
          const progress = new ProgressLine();
          try {
            status = await waitForDrained(ref, status.generation, flags.timeout, (s, elapsed) =>
              progress.update(`${s.worker_id}: ${describeWaiting(s, false)}`, elapsed, describeEta(s)),
            );
          } finally {
            progress.done();
          }
        }
        if (flags.json) process.stdout.write(JSON.stringify(status, null, 2) + '\n');
        else if (status.state === 'drained') process.stdout.write(`worker ${printable(status.worker_id)} drained in ${formatDuration(Date.now() - started)}\n`);
        else process.stdout.write(`${summarize(status)}\n(drain started: \`ebb status\` shows its progress, \`ebb drain --wait\` follows it to drained)\n`);
      });
    });
}
