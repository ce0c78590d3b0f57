import { Command } from 'commander';
import { printable } from '../common/terminal-text.js';
import { addSourceOptions, withClient, type FleetEntry, type SourceFlags } from './admin-client.js';

interface WorkersFlags extends SourceFlags {
  json?: boolean;
}

/** A plain left-aligned table: operators read it, scripts use --json. Cells are shown escaped (one row per line, whatever a worker reports). */
export function renderTable(cells: string[][]): string {
  const rows = cells.map((r) => r.map(printable));
  const widths = rows[0]?.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? '').length))) ?? [];
  return rows.map((r) => r.map((cell, i) => (i === r.length - 1 ? cell : cell.padEnd(widths[i] ?? 0))).join('  ').trimEnd()).join('\n');
}

function row(e: FleetEntry): string[] {
  const notes: string[] = [];
  if (!e.in_discovery) notes.push('not in discovery');
  if (e.drain_intent) notes.push(`drain intent: ${e.drain_intent.reason}`);
  if (!e.reachable) notes.push(e.error ?? 'unreachable');
  else if (e.status?.waiting_for.length) notes.push(`waiting for: ${e.status.waiting_for.join('; ')}`);
  // LoRA adapters that hold a slot: state and in-flight each.
  const adapters = e.reachable ? (e.status?.adapters ?? []).filter((a) => a.state !== 'unloaded') : [];
  if (adapters.length > 0) notes.push(`adapters: ${adapters.map((a) => `${a.name} ${a.state} ${a.inflight_requests}`).join(', ')}`);
  return [
    e.worker_id,
    e.model,
    e.mode,
    e.reachable ? (e.state ?? '?') : 'unreachable',
    e.reachable && e.status ? String(e.status.inflight_requests) : '-',
    e.system_url,
    notes.join('; '),
  ];
}

export function workersCommand(): Command {
  return addSourceOptions(
    new Command('workers').description('list the fleet: every worker with its live state (from a frontend admin API or from discovery)'),
  )
    .option('--json', 'print the fleet view as JSON')
    .action(async (flags: WorkersFlags) => {
      await withClient(flags, async (client) => {
        const fleet = await client.fleet();
        if (flags.json) {
          process.stdout.write(JSON.stringify({ workers: fleet }, null, 2) + '\n');
          return;
        }
        if (fleet.length === 0) {
          process.stdout.write(`no workers in ${client.sourceLabel}\n`);
          return;
        }
        process.stdout.write(renderTable([['ID', 'MODEL', 'MODE', 'STATE', 'IN-FLIGHT', 'SYSTEM URL', 'NOTE'], ...fleet.map(row)]) + '\n');
      });
    });
}
