import { Command, Option } from 'commander';
import { ADMIN_TOKEN_ENV, bearerHeader, loadAdminToken } from '../common/admin-auth.js';
import { adminCall, createAdminAgent, errorMessageOf, fetchLiveStatus, Unreachable, type AdminResponse, type WorkerStatus } from '../common/worker-admin.js';
import { connectDiscovery } from '../discovery/connect.js';
import type { Discovery, WorkerRecord } from '../discovery/discovery.js';
import { discoveryDefault } from './options.js';

/**
 * What the operator commands (workers, drain, resume, status, rollout) share: where the fleet is
 * read from (the frontend's admin API or discovery), how a worker is addressed, the token, and
 * waiting for a drain. Every failure is a CliError: one line for the operator, and an exit code.
 */

/** Exit codes: 1 for failures, 2 for "did not happen within --timeout". */
export const EXIT_FAILURE = 1;
export const EXIT_TIMEOUT = 2;

export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode = EXIT_FAILURE,
  ) {
    super(message);
  }
}

/** How often a waiting command re-reads /engine/status. */
export const POLL_INTERVAL_MS = 250;
/** Per-call bound on admin calls made by the CLI (a drain answers once discovery is updated). */
const CALL_TIMEOUT_MS = 10_000;
/** Per-worker bound on a status read when listing the fleet from discovery (as the frontend does). */
const LIST_STATUS_TIMEOUT_MS = 1000;

export interface SourceFlags {
  frontend?: string;
  discovery?: string;
  tokenFile?: string;
}

/** --frontend / --discovery (one or the other) and --token-file, for every operator command. */
export function addSourceOptions(cmd: Command): Command {
  return cmd
    .addOption(new Option('--frontend <url>', "a frontend's admin API, e.g. http://127.0.0.1:8001 (its --admin-port)").conflicts('discovery'))
    .addOption(new Option('--discovery <url>', `read the fleet from discovery instead (default: env EBB_DISCOVERY or ${discoveryDefault()})`))
    .option('--token-file <path>', `file holding the admin bearer token (env ${ADMIN_TOKEN_ENV})`);
}

/** One entry of the fleet view, whichever source it came from (the shape of the frontend's GET /workers). */
export interface FleetEntry extends WorkerRecord {
  in_discovery: boolean;
  state: string | null;
  reachable: boolean;
  status?: WorkerStatus;
  error?: string;
}

export const trimUrl = (url: string): string => url.replace(/\/+$/, '');
const isUrl = (s: string): boolean => /^https?:\/\//i.test(s);

/** A worker the CLI can act on: directly at its system URL, or through a frontend's admin API. */
export interface WorkerRef {
  /** For messages: "worker w-1234 (http://127.0.0.1:4000)". */
  readonly label: string;
  readonly record?: WorkerRecord | undefined;
  status(): Promise<WorkerStatus>;
  /** Starts a drain; resolves with the status the worker answered (draining, or drained already). */
  drain(reason: string): Promise<WorkerStatus>;
  resume(): Promise<WorkerStatus>;
}

export class AdminClient {
  private readonly agent = createAdminAgent(2000);
  private constructor(
    readonly source: { kind: 'frontend'; url: string } | { kind: 'discovery'; url: string },
    private readonly token: string | undefined,
  ) {}

  static async create(flags: SourceFlags): Promise<AdminClient> {
    const token = await loadAdminToken(flags.tokenFile);
    const source = flags.frontend !== undefined ? { kind: 'frontend' as const, url: trimUrl(flags.frontend) } : { kind: 'discovery' as const, url: flags.discovery ?? discoveryDefault() };
    if (source.kind === 'frontend' && !isUrl(source.url)) throw new CliError(`--frontend expects the admin API URL of a frontend, like http://127.0.0.1:8001; got "${source.url}"`);
    return new AdminClient(source, token);
  }

  async close(): Promise<void> {
    await this.agent.close();
    const discovery = await this.discovery?.catch(() => undefined);
    await discovery?.close().catch(() => undefined);
  }

  /** The command line that puts `entry` back in rotation (a drained worker is not in discovery: use its URL then). */
  resumeHint(entry: WorkerRecord): string {
    return this.source.kind === 'frontend' ? `ebb resume ${entry.worker_id} --frontend ${this.source.url}` : `ebb resume ${entry.system_url}`;
  }

  get sourceLabel(): string {
    return this.source.kind === 'frontend' ? `the frontend admin API at ${this.source.url}` : `discovery at ${this.source.url}`;
  }

  /** One admin call; `what` names the far end for the error message ("worker w-1", "the frontend admin API"). */
  async call<T>(url: string, method: 'GET' | 'POST', what: string, body?: unknown): Promise<AdminResponse<T>> {
    try {
      return await adminCall<T>(url, { method, headers: bearerHeader(this.token), body, timeoutMs: CALL_TIMEOUT_MS, agent: this.agent });
    } catch (err) {
      if (err instanceof Unreachable) throw new CliError(`cannot reach ${what}: ${err.reason}`);
      throw err;
    }
  }

  /** Every worker the source knows, with its live status (unreachable ones included, marked). */
  async fleet(): Promise<FleetEntry[]> {
    if (this.source.kind === 'frontend') {
      const res = await this.call<{ workers?: FleetEntry[] }>(`${this.source.url}/workers`, 'GET', this.sourceLabel);
      if (res.statusCode !== 200 || !Array.isArray(res.body.workers))
        throw new CliError(`the frontend admin API at ${this.source.url} answered HTTP ${res.statusCode} to GET /workers: ${errorMessageOf(res.body)}`);
      return res.body.workers;
    }
    const records = await this.discoveryRecords();
    const entries = await Promise.all(
      records.map(async (r): Promise<FleetEntry> => {
        const live = await fetchLiveStatus(r.system_url, this.agent, LIST_STATUS_TIMEOUT_MS);
        return { ...r, in_discovery: true, state: live.reachable ? live.status.state : null, ...live };
      }),
    );
    return entries.sort((a, b) => a.worker_id.localeCompare(b.worker_id));
  }

  /** One discovery connection per command, opened on first use (rollout lists it every poll). */
  private discovery?: Promise<Discovery>;

  private async discoveryRecords(): Promise<WorkerRecord[]> {
    this.discovery ??= connectDiscovery(this.source.url);
    let discovery: Discovery;
    try {
      discovery = await this.discovery;
    } catch (err) {
      throw new CliError(`cannot open discovery at ${this.source.url}: ${(err as Error).message}`);
    }
    try {
      return await discovery.list();
    } catch (err) {
      throw new CliError(`cannot list workers from discovery at ${this.source.url}: ${(err as Error).message}`);
    }
  }

  /** A worker id (looked up through the source) or a system URL (used as it is). */
  async resolve(target: string): Promise<WorkerRef> {
    if (isUrl(target)) return this.direct(trimUrl(target));
    if (this.source.kind === 'frontend') {
      const url = `${this.source.url}/workers/${encodeURIComponent(target)}`;
      const res = await this.call<FleetEntry>(url, 'GET', this.sourceLabel);
      if (res.statusCode === 404) throw new CliError(`no worker "${target}" is known to ${this.sourceLabel}`);
      if (res.statusCode !== 200) throw new CliError(`${this.sourceLabel} answered HTTP ${res.statusCode} for worker "${target}": ${errorMessageOf(res.body)}`);
      return this.viaFrontend(res.body);
    }
    const record = (await this.discoveryRecords()).find((r) => r.worker_id === target);
    if (!record)
      throw new CliError(
        `worker "${target}" is not in ${this.sourceLabel} (a draining or drained worker unregisters itself): pass its system URL, or --frontend URL, which remembers it`,
      );
    return this.direct(record.system_url, record);
  }

  /** The refs for fleet entries: through the frontend when that is the source, else direct. */
  refFor(entry: FleetEntry): WorkerRef {
    return this.source.kind === 'frontend' ? this.viaFrontend(entry) : this.direct(entry.system_url, entry);
  }

  private direct(systemUrl: string, record?: WorkerRecord): WorkerRef {
    const label = record ? `worker ${record.worker_id} (${systemUrl})` : `worker at ${systemUrl}`;
    const expectStatus = (res: AdminResponse<WorkerStatus>, action: string, ok: number[]): WorkerStatus => {
      if (ok.includes(res.statusCode) && typeof res.body?.state === 'string') return res.body;
      throw new CliError(`${label} refused ${action}: HTTP ${res.statusCode}: ${errorMessageOf(res.body)}`);
    };
    return {
      label,
      record,
      status: async () => expectStatus(await this.call<WorkerStatus>(`${systemUrl}/engine/status`, 'GET', label), 'status', [200]),
      drain: async (reason) => expectStatus(await this.call<WorkerStatus>(`${systemUrl}/engine/drain`, 'POST', label, { reason }), 'drain', [200, 202]),
      resume: async () => expectStatus(await this.call<WorkerStatus>(`${systemUrl}/engine/resume`, 'POST', label), 'resume', [200]),
    };
  }

  private viaFrontend(entry: WorkerRecord): WorkerRef {
    if (this.source.kind !== 'frontend') throw new Error('not a frontend source');
    const base = `${this.source.url}/workers/${encodeURIComponent(entry.worker_id)}`;
    const label = `worker ${entry.worker_id} (${entry.system_url}, via ${this.source.url})`;
    const expectStatus = (res: AdminResponse<WorkerStatus>, action: string, ok: number[]): WorkerStatus => {
      if (ok.includes(res.statusCode) && typeof res.body?.state === 'string') return res.body;
      throw new CliError(`${label} refused ${action}: HTTP ${res.statusCode}: ${errorMessageOf(res.body)}`);
    };
    return {
      label,
      record: entry,
      status: async () => {
        const res = await this.call<FleetEntry>(base, 'GET', this.sourceLabel);
        if (res.statusCode !== 200) throw new CliError(`${label}: frontend answered HTTP ${res.statusCode}: ${errorMessageOf(res.body)}`);
        if (!res.body.reachable || !res.body.status) throw new CliError(`cannot reach ${label}: ${res.body.error ?? 'no status'}`);
        return res.body.status;
      },
      drain: async (reason) => expectStatus(await this.call<WorkerStatus>(`${base}/drain`, 'POST', this.sourceLabel, { reason }), 'drain', [200, 202]),
      resume: async () => expectStatus(await this.call<WorkerStatus>(`${base}/resume`, 'POST', this.sourceLabel), 'resume', [200]),
    };
  }
}

/** Runs `fn` with a client and always closes it. */
export async function withClient<T>(flags: SourceFlags, fn: (client: AdminClient) => Promise<T>): Promise<T> {
  const client = await AdminClient.create(flags);
  try {
    return await fn(client);
  } finally {
    await client.close();
  }
}

export function formatDuration(ms: number): string {
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)}s`;
  const s = Math.round(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, '0')}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}m`;
}

/**
 * A progress line on stderr: rewritten in place (\r) on a terminal; elsewhere (CI logs, pipes) one
 * line each time what it says changes, ignoring the elapsed time so a log is not one line per poll.
 */
export class ProgressLine {
  private last = '';
  private readonly tty: boolean;
  private drawn = false;

  constructor(private readonly out: NodeJS.WriteStream = process.stderr) {
    this.tty = out.isTTY === true;
  }

  update(text: string, elapsedMs: number): void {
    if (this.tty) {
      this.out.write(`\r${text}  ${formatDuration(elapsedMs)}\x1b[K`);
      this.drawn = true;
    } else if (text !== this.last) this.out.write(`${text}  (${formatDuration(elapsedMs)})\n`);
    this.last = text;
  }

  /** Ends the line on a terminal so the next output starts clean. */
  done(): void {
    if (this.tty && this.drawn) this.out.write('\n');
    this.drawn = false;
  }
}

export function describeWaiting(s: WorkerStatus): string {
  const waits = s.waiting_for.length > 0 ? `, waiting for: ${s.waiting_for.join('; ')}` : '';
  return `${s.state}, in-flight ${s.inflight_requests}${waits}`;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * Polls the worker's status until it reports `drained`. The worker has no push channel for its
 * state (the Admin API is request/response), so polling GET /engine/status every POLL_INTERVAL_MS
 * is the only signal there is; the worker serves it from memory, so it costs next to nothing.
 * Throws CliError(EXIT_TIMEOUT) past the deadline, CliError(EXIT_FAILURE) if the worker goes back to
 * serving (someone resumed it) or stops answering.
 */
export async function waitForDrained(
  ref: WorkerRef,
  timeoutMs: number,
  onProgress: (status: WorkerStatus, elapsedMs: number) => void = () => undefined,
): Promise<WorkerStatus> {
  const started = Date.now();
  let failures = 0;
  let last: WorkerStatus | undefined;
  for (;;) {
    let status: WorkerStatus | undefined;
    try {
      status = await ref.status();
      failures = 0;
    } catch (err) {
      // One failed read can be a blip (a busy event loop, a timeout); three in a row means it is gone.
      if (!(err instanceof CliError) || ++failures >= 3) throw err;
    }
    if (status) {
      last = status;
      onProgress(status, Date.now() - started);
      if (status.state === 'drained') return status;
      if (status.state === 'serving') throw new CliError(`${ref.label} is serving again (resumed by someone else?) while waiting for it to drain`);
    }
    const elapsed = Date.now() - started;
    if (elapsed >= timeoutMs) {
      const where = last ? ` (still ${describeWaiting(last)})` : '';
      throw new CliError(`${ref.label} did not drain within ${formatDuration(timeoutMs)}${where}; it stays out of rotation until resumed`, EXIT_TIMEOUT);
    }
    await sleep(Math.min(POLL_INTERVAL_MS, timeoutMs - elapsed));
  }
}

/** The workers of a model that are in rotation: listed in discovery, reachable, and serving. */
export function servingOf(fleet: FleetEntry[], model: string): FleetEntry[] {
  return fleet.filter((e) => e.model === model && e.in_discovery && e.reachable && e.state === 'serving');
}

