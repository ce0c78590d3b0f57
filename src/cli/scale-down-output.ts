import { printable } from '../common/terminal-text.js';
import type { RankedWorker } from '../frontend/admin/victim-ranking.js';
import type { WorkerMode } from '../protocol/worker-mode.js';
import type { SourceFlags } from './admin-client.js';

/** What `ebb scale-down` is given and how it talks, shared by its fleet and Kubernetes paths. */

export interface ScaleDownFlags extends SourceFlags {
  model?: string;
  count: number;
  /** Exactly these victims (a dry run's); count is their number. */
  workers?: string[];
  pool?: WorkerMode;
  dryRun?: boolean;
  wait?: boolean;
  json?: boolean;
  timeout: number;
  drainDeadline?: number;
  k8sSelector?: string;
  k8sScale?: string;
  namespace?: string;
  kubeconfig?: string;
}

/** One line on stderr; it may quote what a worker reports, so it is shown escaped. */
export const say = (line: string) => process.stderr.write(`${printable(line)}\n`);

/** The ranking as a table, victims marked, one row a line (each row escaped, not the newlines between): what `--dry-run` prints. */
export function rankingTable(ranking: RankedWorker[], victims: readonly RankedWorker[]): string {
  return ranking.map((r) => printable(`${victims.includes(r) ? '*' : ' '} ${String(r.rank).padStart(2)}. ${r.worker_id} (${r.pool}): ${r.reason}`)).join('\n');
}

