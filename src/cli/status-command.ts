import { Command } from 'commander';
import { printable } from '../common/terminal-text.js';
import type { WorkerStatus } from '../common/worker-admin.js';
import { addSourceOptions, withClient, WORKER_ARGUMENT, type SourceFlags } from './admin-client.js';
import { formatDuration } from './progress-line.js';

interface StatusFlags extends SourceFlags {
  json?: boolean;
}

/** A few lines an operator can read at a glance (what the worker reports, shown escaped); --json has everything. */
export function summarize(s: WorkerStatus, now = Date.now()): string {
  const p = (v: unknown) => printable(String(v));
  const since = Date.parse(s.state_since);
  const lines = [
    `worker ${p(s.worker_id)}: ${p(s.state)}${Number.isNaN(since) ? '' : ` for ${formatDuration(Math.max(0, now - since))}`}${s.shutting_down ? ' (shutting down)' : ''}`,
    `  in-flight ${p(s.inflight_requests)}, admission ${s.admission_open ? 'open' : 'closed'}, in discovery: ${s.discovery_registered ? 'yes' : 'no'}, generation ${p(s.generation)}`,
  ];
  if (s.waiting_for.length > 0) lines.push(`  waiting for: ${p(s.waiting_for.join('; '))}`);
  if (s.drain_reason) lines.push(`  drain reason: ${p(s.drain_reason)}`);
  if (s.last_error) lines.push(`  last error: ${p(s.last_error)}`);
  return lines.join('\n');
}

export function statusCommand(): Command {
  return addSourceOptions(
    new Command('status')
      .description("show one worker's lifecycle status")
      .argument('<worker>', WORKER_ARGUMENT),
  )
    .option('--json', 'print the status as JSON')
    .action(async (target: string, flags: StatusFlags) => {
      await withClient(flags, async (client) => {
        const status = await (await client.resolve(target)).status();
        process.stdout.write((flags.json ? JSON.stringify(status, null, 2) : summarize(status)) + '\n');
      });
    });
}
