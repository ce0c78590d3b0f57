import { Command } from 'commander';
import { addSourceOptions, withClient, type AdminClient, type SourceFlags } from './admin-client.js';
import { CliError } from './cli-error.js';
import { renderTable } from './workers-command.js';

interface IntentsFlags extends SourceFlags {
  json?: boolean;
}

const none = (client: AdminClient) => new CliError(`${client.sourceLabel} keeps no drain intents (only etcd does)`);

function clearCommand(): Command {
  return addSourceOptions(
    new Command('clear')
      .description('remove drain intents: the workers keep their current state, and their next restart serves')
      .argument('[worker...]', 'worker ids'),
  )
    .option('--all', 'remove every drain intent')
    .action(async (ids: string[], _opts: unknown, self: Command) => {
      // `ebb intents --discovery URL clear ID` and `ebb intents clear ID --discovery URL` alike.
      const flags = self.optsWithGlobals<SourceFlags & { all?: boolean }>();
      if ((ids.length === 0) === (flags.all !== true)) throw new CliError('intents clear needs worker ids, or --all');
      await withClient(flags, async (client) => {
        const targets = flags.all ? [...((await client.intents())?.keys() ?? [])] : ids;
        for (const id of targets) {
          if (!(await client.clearIntent(id))) throw none(client);
          process.stdout.write(`drain intent of ${id} removed\n`);
        }
      });
    });
}

/**
 * Drain intents (etcd): the drains that outlive a worker process, so a restart under the same id
 * comes back drained. Listed and cleared here; resuming the running worker clears its own.
 */
export function intentsCommand(): Command {
  return addSourceOptions(new Command('intents').description('list the drain intents kept in discovery (etcd): worker ids that restart drained until resumed or cleared'))
    .option('--json', 'print the intents as JSON')
    .action(async (flags: IntentsFlags) => {
      await withClient(flags, async (client) => {
        const intents = await client.intents();
        if (intents === undefined) throw none(client);
        const rows = [...intents.entries()].sort(([a], [b]) => a.localeCompare(b));
        if (flags.json) {
          process.stdout.write(JSON.stringify({ intents: rows.map(([worker_id, i]) => ({ worker_id, ...i })) }, null, 2) + '\n');
          return;
        }
        if (rows.length === 0) {
          process.stdout.write(`no drain intents in ${client.sourceLabel}\n`);
          return;
        }
        const table = rows.map(([id, i]) => [id, i.at || '-', i.expires_at ?? '-', i.worker?.system_url ?? '-', i.reason]);
        process.stdout.write(renderTable([['ID', 'SINCE', 'EXPIRES', 'LAST SYSTEM URL', 'REASON'], ...table]) + '\n');
      });
    })
    .addCommand(clearCommand());
}
