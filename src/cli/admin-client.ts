import { Command, Option } from 'commander';
import { ADMIN_TOKEN_ENV, bearerHeader, loadAdminToken } from '../common/admin-auth.js';
import type { DrainBody } from '../protocol/admin.js';
import { adminCall, createAdminAgent, errorMessageOf, fetchLiveStatus, Unreachable, type AdminResponse, type WorkerStatus } from '../common/worker-admin.js';
import { connectDiscovery } from '../discovery/connect.js';
import type { Discovery, WorkerRecord } from '../discovery/discovery.js';
import type { DrainIntent } from '../discovery/drain-intent.js';
import { lockHolder, ScaleDownLockHeld } from '../discovery/scale-down-lock.js';
import { codeOf } from '../protocol/errors.js';
import { readSse } from '../common/sse-hub.js';
import { request } from 'undici';
import { CliError } from './cli-error.js';
import { discoveryDefault, discoveryOption, fleetNameOption } from './options.js';
import { runningUps } from './up-state.js';
import { discardBody } from '../common/discard-body.js';

/**
 * The HTTP admin client the operator commands (workers, drain, resume, status, rollout) share: where
 * the fleet is read from (the frontend's admin API or discovery), how a worker is addressed, and the
 * token. Every failure is a CliError.
 */

/** Per-call bound on admin calls made by the CLI (a drain answers once discovery is updated). */
const CALL_TIMEOUT_MS = 10_000;
/** Per-worker bound on a status read when listing the fleet from discovery (as the frontend does). */
const LIST_STATUS_TIMEOUT_MS = 1000;

export interface SourceFlags {
  frontend?: string;
  discovery?: string;
  tokenFile?: string;
  adminTokenFile?: string;
  fleet?: string;
}

/** The <worker> of status, drain and resume: by id through the fleet, or by URL with no fleet at all. */
export const WORKER_ARGUMENT =
  "worker id (looked up through --frontend, --fleet or discovery) or the worker's system URL, e.g. http://127.0.0.1:9090: a URL is used directly, nothing is looked up (it works whatever `ebb up` fleets run, and ignores --frontend, --fleet and --discovery)";

/** --frontend / --discovery (one or the other) and --token-file, for every operator command. */
export function addSourceOptions(cmd: Command): Command {
  return cmd
    .addOption(new Option('--frontend <url>', "a frontend's admin API, e.g. http://127.0.0.1:8001 (its --admin-port)").conflicts(['discovery', 'fleet']))
    .addOption(new Option('--fleet <name>', 'the running `ebb up` named so (its --name, else its pid), when several run').argParser(fleetNameOption).conflicts('discovery'))
    .addOption(new Option('--discovery <url>', `read the fleet from discovery instead (default: env EBB_DISCOVERY, else the running \`ebb up\`'s frontend, else file://$XDG_RUNTIME_DIR/ebb/discovery, else file://$TMPDIR/ebb-<uid>/discovery)`).argParser(discoveryOption))
    .option('--token-file <path>', `file holding the admin bearer token (env ${ADMIN_TOKEN_ENV})`)
    // The servers' name for the same file, so either spelling works everywhere.
    .addOption(new Option('--admin-token-file <path>', 'the same as --token-file').hideHelp().conflicts('tokenFile'));
}

/**
 * --fleet, or no source given (no flag, no EBB_DISCOVERY): the frontend admin API of this user's
 * running `ebb up`, if any. Several running and none named is refused: acting on the wrong fleet, or
 * saying "no workers" about a default that none of them uses, would mislead.
 */
function defaultSource(flags: SourceFlags): { kind: 'frontend'; url: string } | undefined {
  if (flags.fleet === undefined && (flags.discovery !== undefined || process.env.EBB_DISCOVERY !== undefined)) return undefined;
  const ups = runningUps();
  const list = () => ups.map((u) => `${u.name} (${u.frontend_url}, ebb up pid ${u.pid})`).join(', ');
  if (flags.fleet !== undefined) {
    const named = ups.find((u) => u.name === flags.fleet);
    if (named === undefined) throw new CliError(ups.length === 0 ? `no \`ebb up\` named "${flags.fleet}" is running (none is)` : `no \`ebb up\` named "${flags.fleet}" is running; running: ${list()}`);
    if (named.admin_url === undefined) throw new CliError(`the \`ebb up\` named "${named.name}" has no admin listener`);
    return { kind: 'frontend', url: trimUrl(named.admin_url) };
  }
  if (ups.length > 1) throw new CliError(`${ups.length} \`ebb up\` fleets are running: ${list()}; say which with --fleet NAME (or --frontend URL)`);
  const up = ups[0];
  return up?.admin_url === undefined ? undefined : { kind: 'frontend', url: trimUrl(up.admin_url) };
}

/** One entry of the fleet view, whichever source it came from (the shape of the frontend's GET /workers). */
export interface FleetEntry extends WorkerRecord {
  in_discovery: boolean;
  /** Read from discovery only: the drain intent held for this worker id (it restarts drained under it). */
  drain_intent?: DrainIntent;
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
  drain(body: DrainBody): Promise<WorkerStatus>;
  resume(): Promise<WorkerStatus>;
  /**
   * The worker's status as it changes, pushed (its /engine/status/events, or the frontend's
   * /workers/events filtered to it); ends when the stream does. Throws Unreachable-style CliErrors
   * never: a stream that cannot be opened throws a plain Error, and the caller falls back to reading.
   */
  statusEvents(signal: AbortSignal): AsyncGenerator<WorkerStatus, void, void>;
}

export type FleetSource = { kind: 'frontend'; url: string } | { kind: 'discovery'; url: string };

export class AdminClient {
  private readonly agent = createAdminAgent(2000);
  private picked: FleetSource | undefined;
  private constructor(
    private readonly flags: SourceFlags,
    private readonly token: string | undefined,
  ) {}

  static async create(flags: SourceFlags): Promise<AdminClient> {
    const token = await loadAdminToken(flags.tokenFile ?? flags.adminTokenFile);
    if (flags.frontend !== undefined && !isUrl(trimUrl(flags.frontend))) throw new CliError(`--frontend expects the admin API URL of a frontend, like http://127.0.0.1:8001; got "${trimUrl(flags.frontend)}"`);
    return new AdminClient(flags, token);
  }

  /**
   * Where the fleet is read from, picked on first use: a command given a worker's URL never asks
   * (see resolve), so the `ebb up` fleets running, however many, are nothing to it.
   */
  get source(): FleetSource {
    this.picked ??= this.flags.frontend !== undefined ? { kind: 'frontend', url: trimUrl(this.flags.frontend) } : (defaultSource(this.flags) ?? { kind: 'discovery', url: this.flags.discovery ?? discoveryDefault() });
    return this.picked;
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

  /** The events of an SSE endpoint; a plain Error when it cannot be opened (an older ebb has none). */
  async *events(url: string, signal: AbortSignal): AsyncGenerator<{ event: string; data: unknown }, void, void> {
    const res = await request(url, { headers: { accept: 'text/event-stream', ...bearerHeader(this.token) }, dispatcher: this.agent, signal, bodyTimeout: 0 });
    if (res.statusCode !== 200) {
      await res.body.text().catch(() => undefined);
      throw new Error(`${url}: HTTP ${res.statusCode}`);
    }
    try {
      yield* readSse(res.body);
    } finally {
      discardBody(res.body);
    }
  }

  /**
   * Every worker the source knows, with its live status (unreachable ones included, marked).
   * `statusTimeoutMs`: the per-worker bound on a status read from discovery (a listing is quick; a
   * scale-down, which must rank every worker, waits as long as a call).
   */
  async fleet(statusTimeoutMs = LIST_STATUS_TIMEOUT_MS): Promise<FleetEntry[]> {
    if (this.source.kind === 'frontend') {
      const res = await this.call<{ workers?: FleetEntry[] }>(`${this.source.url}/workers`, 'GET', this.sourceLabel);
      if (res.statusCode !== 200 || !Array.isArray(res.body.workers))
        throw new CliError(`the frontend admin API at ${this.source.url} answered HTTP ${res.statusCode} to GET /workers: ${errorMessageOf(res.body)}${await this.publicPortHint(res.statusCode)}`);
      return res.body.workers;
    }
    const [records, intents] = await Promise.all([this.discoveryRecords(), this.intents()]);
    const listed = new Set(records.map((r) => r.worker_id));
    // A worker that started drained under an intent never registered: its intent names it.
    const unlisted = [...(intents ?? new Map<string, DrainIntent>()).values()].flatMap((i) => (i.worker !== undefined && !listed.has(i.worker.worker_id) ? [i.worker] : []));
    const entries = await Promise.all(
      [...records, ...unlisted].map(async (r): Promise<FleetEntry> => {
        const live = await fetchLiveStatus(r.system_url, r.worker_id, this.agent, statusTimeoutMs, { token: this.token, proveFirst: true });
        const intent = intents?.get(r.worker_id);
        return { ...r, in_discovery: listed.has(r.worker_id), state: live.reachable ? live.status.state : null, ...live, ...(intent ? { drain_intent: intent } : {}) };
      }),
    );
    return entries.sort((a, b) => a.worker_id.localeCompare(b.worker_id));
  }

  /** The drain intents discovery holds (undefined where the backend keeps none: file, memory). */
  async intents(): Promise<Map<string, DrainIntent> | undefined> {
    this.assertDiscoverySource();
    const store = (await this.openDiscovery()).drainIntents;
    if (store === undefined) return undefined;
    try {
      return await store.list();
    } catch (err) {
      throw new CliError(`cannot list drain intents from discovery at ${this.source.url}: ${(err as Error).message}`);
    }
  }

  private assertDiscoverySource(): void {
    if (this.source.kind === 'frontend') throw new CliError('drain intents are kept in discovery: pass --discovery etcd://HOST:2379 instead of --frontend');
  }

  /** Removes the drain intent of `workerId`; false where the backend keeps none. */
  async clearIntent(workerId: string): Promise<boolean> {
    this.assertDiscoverySource();
    const store = (await this.openDiscovery()).drainIntents;
    if (store === undefined) return false;
    try {
      await store.delete(workerId);
      return true;
    } catch (err) {
      throw new CliError(`cannot remove the drain intent of ${workerId} from discovery at ${this.source.url}: ${(err as Error).message}`);
    }
  }

  /** One discovery connection per command, opened on first use (rollout lists it every poll). */
  private discovery?: Promise<Discovery>;

  private async openDiscovery(): Promise<Discovery> {
    this.discovery ??= connectDiscovery(this.source.url);
    try {
      return await this.discovery;
    } catch (err) {
      throw new CliError(`cannot open discovery at ${this.source.url}: ${(err as Error).message}`);
    }
  }

  private async discoveryRecords(): Promise<WorkerRecord[]> {
    const discovery = await this.openDiscovery();
    try {
      return await discovery.list();
    } catch (err) {
      throw new CliError(`cannot list workers from discovery at ${this.source.url}: ${(err as Error).message}`);
    }
  }

  /**
   * A 404 from a frontend's public (OpenAI) port rather than its admin listener, a common slip: said
   * so, with the admin port to use when the OpenAI port answers /v1/models there. Empty otherwise.
   */
  private async publicPortHint(status: number): Promise<string> {
    if (status !== 404 || this.source.kind !== 'frontend') return '';
    const models = await this.call<{ object?: unknown }>(`${this.source.url}/v1/models`, 'GET', this.sourceLabel).catch(() => undefined);
    if (models?.statusCode !== 200 || models.body.object !== 'list') return '';
    const admin = new URL(this.source.url);
    const next = admin.port === '' ? undefined : Number(admin.port) + 1;
    if (next !== undefined) admin.port = String(next);
    return `; ${this.source.url} is a frontend's OpenAI port, not its admin API, which listens on --admin-port (default: --port + 1${next !== undefined ? `: try --frontend ${admin.origin}` : ''})`;
  }

  /** A worker id (looked up through the source) or a system URL (used as it is: no source is picked). */
  async resolve(target: string): Promise<WorkerRef> {
    if (isUrl(target)) return this.direct(trimUrl(target));
    if (this.source.kind === 'frontend') {
      const url = `${this.source.url}/workers/${encodeURIComponent(target)}`;
      const res = await this.call<FleetEntry>(url, 'GET', this.sourceLabel);
      if (codeOf(res.body) === 'worker_not_found') throw new CliError(`no worker "${target}" is known to ${this.sourceLabel}`);
      if (res.statusCode !== 200) throw new CliError(`${this.sourceLabel} answered HTTP ${res.statusCode} for worker "${target}": ${errorMessageOf(res.body)}${await this.publicPortHint(res.statusCode)}`);
      return this.viaFrontend(res.body);
    }
    const record = (await this.discoveryRecords()).find((r) => r.worker_id === target) ?? (await this.intents())?.get(target)?.worker;
    if (!record)
      throw new CliError(
        `worker "${target}" is not in ${this.sourceLabel} (a draining or drained worker unregisters itself): pass its system URL, or --frontend URL, which remembers it`,
      );
    // The URL is discovery's: it gets the operator's token only once it answers as that worker (its open /live says).
    const live = await fetchLiveStatus(record.system_url, record.worker_id, this.agent, CALL_TIMEOUT_MS, { token: this.token, proveFirst: true });
    if (!live.reachable) throw new CliError(`worker ${record.worker_id} (${record.system_url}) from ${this.sourceLabel}: ${live.error}; nothing was sent to it`);
    return this.direct(record.system_url, record);
  }

  /** The per-call bound: what a scale-down gives each status read, so that a slow worker is ranked, not skipped. */
  static readonly CALL_TIMEOUT_MS = CALL_TIMEOUT_MS;

  /** Discovery's scale-down lock of `model` (see discovery/scale-down-lock); a CliError naming the holder when taken. */
  async scaleDownLock(model: string): Promise<() => Promise<void>> {
    const discovery = await this.openDiscovery();
    try {
      return await discovery.scaleDownLocks.acquire(model, lockHolder('ebb scale-down'));
    } catch (err) {
      if (err instanceof ScaleDownLockHeld) throw new CliError(err.message);
      throw new CliError(`cannot take the scale-down lock of ${model} in discovery at ${this.source.url}: ${(err as Error).message}`);
    }
  }

  /** A worker at its own system URL, whatever the source: what a rollback falls back to when the frontend is gone. */
  systemRef(record: WorkerRecord): WorkerRef {
    return this.direct(record.system_url, record);
  }

  /** The refs for fleet entries: through the frontend when that is the source, else direct. */
  refFor(entry: FleetEntry): WorkerRef {
    return this.source.kind === 'frontend' ? this.viaFrontend(entry) : this.direct(entry.system_url, entry);
  }

  private direct(systemUrl: string, record?: WorkerRecord): WorkerRef {
    const label = record ? `worker ${record.worker_id} (${systemUrl})` : `worker at ${systemUrl}`;
    const events = (url: string, signal: AbortSignal) => this.events(url, signal);
    const expectStatus = (res: AdminResponse<WorkerStatus>, action: string, ok: number[]) => statusIn(res, label, action, ok);
    return {
      label,
      record,
      status: async () => expectStatus(await this.call<WorkerStatus>(`${systemUrl}/engine/status`, 'GET', label), 'status', [200]),
      drain: async (body) => expectStatus(await this.call<WorkerStatus>(`${systemUrl}/engine/drain`, 'POST', label, body), 'drain', [200, 202]),
      resume: async () => expectStatus(await this.call<WorkerStatus>(`${systemUrl}/engine/resume`, 'POST', label), 'resume', [200]),
      statusEvents: async function* (this: void, signal: AbortSignal) {
        for await (const e of events(`${systemUrl}/engine/status/events`, signal)) if (e.event === 'status' && isStatus(e.data)) yield e.data;
      },
    };
  }

  private viaFrontend(entry: WorkerRecord): WorkerRef {
    if (this.source.kind !== 'frontend') throw new Error('not a frontend source');
    const base = `${this.source.url}/workers/${encodeURIComponent(entry.worker_id)}`;
    const frontendUrl = this.source.url;
    const events = (url: string, signal: AbortSignal) => this.events(url, signal);
    const label = `worker ${entry.worker_id} (${entry.system_url}, via ${this.source.url})`;
    const expectStatus = (res: AdminResponse<WorkerStatus>, action: string, ok: number[]) => statusIn(res, label, action, ok);
    return {
      label,
      record: entry,
      status: async () => {
        const res = await this.call<FleetEntry>(base, 'GET', this.sourceLabel);
        if (res.statusCode !== 200) throw new CliError(`${label}: frontend answered HTTP ${res.statusCode}: ${errorMessageOf(res.body)}`);
        if (!res.body.reachable || !isStatus(res.body.status)) throw new CliError(`cannot reach ${label}: ${res.body.error ?? 'no status'}`);
        return res.body.status;
      },
      drain: async (body) => expectStatus(await this.call<WorkerStatus>(`${base}/drain`, 'POST', this.sourceLabel, body), 'drain', [200, 202]),
      resume: async () => expectStatus(await this.call<WorkerStatus>(`${base}/resume`, 'POST', this.sourceLabel), 'resume', [200]),
      statusEvents: async function* (this: void, signal: AbortSignal) {
        for await (const e of events(`${frontendUrl}/workers/events`, signal)) {
          if (e.event === 'snapshot') {
            const mine = (e.data as { workers?: FleetEntry[] }).workers?.find((w) => w.worker_id === entry.worker_id);
            if (isStatus(mine?.status)) yield mine.status;
          } else if (e.event === 'status') {
            const d = e.data as { worker_id?: string; status?: unknown };
            if (d.worker_id === entry.worker_id && isStatus(d.status)) yield d.status;
          }
        }
      },
    };
  }
}

/** A status a waiter can use: a state, and the generation it pins (see waitForDrained). */
function isStatus(body: unknown): body is WorkerStatus {
  const s = body as Partial<WorkerStatus> | undefined;
  return typeof s?.state === 'string' && typeof s.generation === 'number';
}

/** The worker's status out of an answer with one of the `ok` HTTP statuses; anything else is a refusal. */
function statusIn(res: AdminResponse<WorkerStatus>, label: string, action: string, ok: number[]): WorkerStatus {
  if (ok.includes(res.statusCode) && isStatus(res.body)) return res.body;
  throw new CliError(`${label} refused ${action}: HTTP ${res.statusCode}: ${errorMessageOf(res.body)}`);
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
