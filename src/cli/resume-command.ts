import { Command } from 'commander';
import { addSourceOptions, withClient, WORKER_ARGUMENT, type SourceFlags } from './admin-client.js';
import { summarize } from './status-command.js';

interface ResumeFlags extends SourceFlags {
  json?: boolean;
}

export function resumeCommand(): Command {
  return addSourceOptions(
    new Command('resume')
      .description('put a draining or drained worker back in rotation (it reopens admission and registers again)')
      .argument('<worker>', WORKER_ARGUMENT),
  )
    .option('--json', 'print the resulting status as JSON')
    .action(async (target: string, flags: ResumeFlags) => {
      await withClient(flags, async (client) => {
        const status = await (await client.resolve(target)).resume();
        process.stdout.write((flags.json ? JSON.stringify(status, null, 2) : summarize(status)) + '\n');
      });
    });
}
