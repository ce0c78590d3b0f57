import './suite-env.js'; // first: the suite's own environment, before anything reads it
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { dieWithFile } from './reaper.js';

export { killAllNow } from './reaper.js';

export const CLI = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'bin', 'ebb.js');

export type LogLine = Record<string, unknown> & { event?: string };

/** Bound on any single wait in tests, so a broken behaviour fails instead of hanging. */
export const WAIT_BOUND_MS = 20_000;

/**
 * Bound on a process's start (worker_ready, frontend_ready): a fresh node process loading its
 * modules, and a llama.cpp model, takes several times longer on a machine other suites load.
 */
export const START_BOUND_MS = 90_000;

/** The events that say a process has started: waits for them are bounded by START_BOUND_MS. */
const STARTS = new Set(['frontend_ready', 'frontend_process_ready', 'worker_ready', 'engine_ready', 'admin_ready']);

/** Where a wait starts matching: log lines at index >= after (see EbbProcess.mark); boundMs replaces WAIT_BOUND_MS. */
export interface LogCursor {
  after?: number;
  boundMs?: number;
}

export class EbbProcess {
  readonly logs: LogLine[] = [];
  readonly stderr: string[] = [];
  /** Resolves with the exit code (128 for a signal), once every line the process wrote to stdout is in `logs`. */
  readonly exited: Promise<number>;
  private waiters: Array<{ pred: (l: LogLine) => boolean; what: string; after: number; resolve: (l: LogLine) => void; reject: (err: Error) => void }> = [];
  private stderrWaiters: Array<{ pattern: RegExp; resolve: (m: RegExpMatchArray) => void; reject: (err: Error) => void }> = [];
  /** Every stderr line is in `stderr` (children of `ebb up` share the pipe: it can outlive the process). */
  private readonly stderrRead: Promise<void>;
  /** Set once both pipes are closed: "worker exited (code 1)". */
  private closed: string | undefined;

  constructor(readonly proc: ChildProcess, readonly label: string) {
    const stdout = createInterface({ input: proc.stdout! });
    // 'exit' can come before the last lines are read on a loaded machine; only this process holds its
    // stdout (children get pipes of their own), so it ends with the process.
    const stdoutRead = once(stdout, 'close');
    stdout.on('line', (line) => {
      let parsed: LogLine;
      try {
        parsed = JSON.parse(line) as LogLine;
      } catch {
        parsed = { msg: line };
      }
      const index = this.logs.push(parsed) - 1;
      this.waiters = this.waiters.filter((w) => {
        if (index < w.after || !w.pred(parsed)) return true;
        w.resolve(parsed);
        return false;
      });
    });
    const stderr = createInterface({ input: proc.stderr! });
    this.stderrRead = once(stderr, 'close').then(() => undefined);
    stderr.on('line', (line) => {
      this.stderr.push(line);
      this.stderrWaiters = this.stderrWaiters.filter((w) => {
        const m = line.match(w.pattern);
        if (m) w.resolve(m);
        return !m;
      });
    });
    dieWithFile(proc);
    this.exited = once(proc, 'exit').then(async ([code, signal]) => {
      await stdoutRead;
      return (code ?? (signal ? 128 : -1)) as number;
    });
    // On 'close' every line of both pipes has been handled: a wait still pending can never be
    // satisfied, so it fails now instead of at the bound.
    proc.once('close', (code, signal) => {
      this.closed = `${this.label} exited (${signal ?? `code ${code}`})`;
      for (const w of this.waiters) w.reject(this.closedError(w.what));
      this.waiters = [];
      for (const w of this.stderrWaiters) w.reject(this.closedError(`stderr ${w.pattern}`));
      this.stderrWaiters = [];
    });
  }

  private closedError(what: string): Error {
    return new Error(`${this.closed} before ${what}; stderr: ${this.stderr.join('\n')}`);
  }

  get pid(): number {
    return this.proc.pid ?? -1;
  }

  /** The cursor for "from now on": pass it as `after` to match only lines logged after this call. */
  mark(): number {
    return this.logs.length;
  }

  /** Resolves with the first log line at index >= `after` (default 0: past or future) matching `pred`. */
  waitForLog(pred: (l: LogLine) => boolean, what = 'log line', { after = 0, boundMs = WAIT_BOUND_MS }: LogCursor = {}): Promise<LogLine> {
    for (let i = after; i < this.logs.length; i++) {
      const seen = this.logs[i] as LogLine;
      if (pred(seen)) return Promise.resolve(seen);
    }
    if (this.closed !== undefined) return Promise.reject(this.closedError(what));
    return bounded(
      new Promise<LogLine>((resolve, reject) => this.waiters.push({ pred, what, after, resolve, reject })),
      `${this.label}: waiting for ${what}${after > 0 ? ` after log line ${after}` : ''}; stderr: ${this.stderr.join('\n')}`,
      boundMs,
    );
  }

  /**
   * Resolves with the match of the first stderr line (past or future) matching `pattern`; bounded
   * by `boundMs` (START_BOUND_MS where the line says a start ended: `ebb up`'s banner).
   */
  waitForStderr(pattern: RegExp, boundMs = WAIT_BOUND_MS): Promise<RegExpMatchArray> {
    for (const line of this.stderr) {
      const m = line.match(pattern);
      if (m) return Promise.resolve(m);
    }
    if (this.closed !== undefined) return Promise.reject(this.closedError(`stderr ${pattern}`));
    return bounded(
      new Promise<RegExpMatchArray>((resolve, reject) => this.stderrWaiters.push({ pattern, resolve, reject })),
      `${this.label}: waiting for stderr ${pattern}; stderr: ${this.stderr.join('\n')}`,
      boundMs,
    );
  }

  /**
   * Every line matching `pred`, once there are at least `n`: log lines travel a pipe and can trail
   * what the test saw over HTTP (a stream that ended), so a count is read only once it is there.
   */
  async waitForCount(pred: (l: LogLine) => boolean, n: number, what: string): Promise<LogLine[]> {
    const matching = () => this.logs.filter(pred);
    await this.waitForLog(() => matching().length >= n, `${n} lines: ${what}`);
    return matching();
  }

  waitForEvent(event: string, extra: (l: LogLine) => boolean = () => true, cursor: LogCursor = {}): Promise<LogLine> {
    // A process's start is bounded as a start (START_BOUND_MS), whoever waits for it.
    const bound = STARTS.has(event) && cursor.boundMs === undefined ? { ...cursor, boundMs: START_BOUND_MS } : cursor;
    return this.waitForLog((l) => l.event === event && extra(l), `event ${event}`, bound);
  }

  /** Like waitForEvent, but only a line logged after this call counts (never one from before). */
  waitForNextEvent(event: string, extra: (l: LogLine) => boolean = () => true): Promise<LogLine> {
    return this.waitForEvent(event, extra, { after: this.mark() });
  }

  /** The exit code, once the process has exited and its stdout and stderr are read to the end. */
  exitCode(boundMs = WAIT_BOUND_MS): Promise<number> {
    return bounded(
      this.exited.then(async (code) => {
        await this.stderrRead;
        return code;
      }),
      `${this.label}: waiting for exit and the end of its output`,
      boundMs,
    );
  }

  signal(sig: NodeJS.Signals): void {
    this.proc.kill(sig);
  }

  get alive(): boolean {
    return this.proc.exitCode === null && this.proc.signalCode === null;
  }

  async stop(): Promise<void> {
    if (!this.alive) return;
    this.proc.kill('SIGKILL');
    await this.exited;
  }

  /** SIGTERM (a graceful exit: a --cpu-prof profile gets written), then SIGKILL after `graceMs`. */
  async terminate(graceMs = 5000): Promise<void> {
    if (!this.alive) return;
    this.proc.kill('SIGTERM');
    const timer = setTimeout(() => {
      if (this.alive) this.proc.kill('SIGKILL');
    }, graceMs);
    await this.exited;
    clearTimeout(timer);
  }

  indexOfEvent(event: string): number {
    return this.logs.findIndex((l) => l.event === event);
  }
}

export function bounded<T>(p: Promise<T>, what: string, ms = WAIT_BOUND_MS): Promise<T> {
  let timer: NodeJS.Timeout;
  const limit = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out: ${what}`)), ms);
  });
  return Promise.race([p, limit]).finally(() => clearTimeout(timer));
}

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs one `ebb` command to completion (bounded) and keeps its raw output; past the bound it is killed and its output reported. */
export async function runEbb(args: string[], env: Record<string, string | undefined>, boundMs = WAIT_BOUND_MS): Promise<CliResult> {
  const proc = dieWithFile(spawn(process.execPath, [CLI, ...args], { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] }));
  let stdout = '';
  let stderr = '';
  proc.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
  proc.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
  try {
    const [code] = (await bounded(once(proc, 'close'), `ebb ${args.join(' ')}`, boundMs)) as [number | null];
    return { code: code ?? -1, stdout, stderr };
  } catch (err) {
    proc.kill('SIGKILL');
    throw new Error(`${(err as Error).message}\nstdout: ${stdout}\nstderr: ${stderr}`);
  }
}

/** Extra `node` flags for the child, e.g. ['--cpu-prof', '--cpu-prof-dir=/tmp/prof'] (the bench uses them). */
export interface SpawnOptions {
  nodeArgs?: string[];
}

/**
 * An IPC channel, as `ebb up` gives its components: a worker, frontend or `ebb up` whose test file
 * died without a word (SIGKILL) stops on its own when the channel closes, instead of running on.
 */
export function spawnEbb(args: string[], label: string, env: NodeJS.ProcessEnv = {}, opts: SpawnOptions = {}): EbbProcess {
  const proc = spawn(process.execPath, [...(opts.nodeArgs ?? []), CLI, ...args], {
    env: { ...process.env, EBB_LOG_LEVEL: 'info', ...env },
    stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
  });
  return new EbbProcess(proc, label);
}

export interface WorkerHandle extends EbbProcess {
  workerId: string;
  requestUrl: string;
  systemUrl: string;
  /** Its --openai-port listener, when it has one. */
  openaiUrl: string | undefined;
}

export function tempDiscoveryUrl(): string {
  return `file://${mkdtempSync(join(tmpdir(), 'ebb-test-discovery-'))}`;
}

export async function startWorker(args: string[], env: NodeJS.ProcessEnv = {}, opts: SpawnOptions = {}): Promise<WorkerHandle> {
  return workerReady(spawnWorker(args, env, opts));
}

/** `ebb worker` on free ports, not yet ready (see workerReady). */
export function spawnWorker(args: string[], env: NodeJS.ProcessEnv = {}, opts: SpawnOptions = {}): EbbProcess {
  return spawnEbb(['worker', '--port', '0', '--system-port', '0', ...args], 'worker', env, opts);
}

/** A spawned worker, once ready (bounded by START_BOUND_MS), with its id and URLs. */
export async function workerReady(p: EbbProcess): Promise<WorkerHandle> {
  const ready = await p.waitForEvent('worker_ready', undefined, { boundMs: START_BOUND_MS });
  return Object.assign(p, {
    workerId: ready.worker_id as string,
    requestUrl: ready.request_url as string,
    systemUrl: ready.system_url as string,
    openaiUrl: ready.openai_url as string | undefined,
  }) as WorkerHandle;
}

export interface FrontendHandle extends EbbProcess {
  url: string;
}

export async function startFrontend(discoveryUrl: string, args: string[] = [], env: NodeJS.ProcessEnv = {}, opts: SpawnOptions = {}): Promise<FrontendHandle> {
  const p = spawnEbb(['frontend', '--port', '0', '--discovery', discoveryUrl, ...args], 'frontend', env, opts);
  const ready = await p.waitForEvent('frontend_ready', undefined, { boundMs: START_BOUND_MS });
  return Object.assign(p, { url: ready.url as string }) as FrontendHandle;
}

/** Resolves once the frontend's discovery view holds `count` workers (ready workers are registered; its watch sees them). */
export async function frontendSeesWorkers(frontend: EbbProcess, count: number): Promise<void> {
  const seen = new Set<string>();
  await frontend.waitForLog((l) => {
    if (l.event === 'discovery_reset') for (const id of l.workers as string[]) seen.add(id);
    if (l.event === 'worker_added') seen.add(l.worker_id as string);
    return seen.size === count;
  }, `the frontend to see ${count} workers`);
}

/** `count` workers of model m1 (`workerArgs` added) and a frontend on one new discovery, once the frontend routes to all of them. */
export async function startFleet(count: number, workerArgs: string[], frontendArgs: string[] = []): Promise<{ discovery: string; frontend: FrontendHandle; workers: WorkerHandle[] }> {
  const discovery = tempDiscoveryUrl();
  const workers = await Promise.all(Array.from({ length: count }, () => startWorker(['--discovery', discovery, '--model', 'm1', ...workerArgs])));
  const frontend = await startFrontend(discovery, frontendArgs);
  await frontendSeesWorkers(frontend, count);
  return { discovery, frontend, workers };
}

/**
 * A fleet the KV cache routes: `workers` workers and `frontends` kv-router frontends on one discovery
 * (debug logs: their routing decisions), returned once every frontend follows every worker's KV events.
 */
export async function startKvFleet(workerArgs: string[], counts: { workers: number; frontends: number }): Promise<{ workers: WorkerHandle[]; frontends: FrontendHandle[] }> {
  const discovery = tempDiscoveryUrl();
  const workers = await Promise.all(Array.from({ length: counts.workers }, () => startWorker(['--discovery', discovery, ...workerArgs])));
  const frontends: FrontendHandle[] = [];
  for (let i = 0; i < counts.frontends; i++) frontends.push(await startFrontend(discovery, ['--router', 'kv'], { EBB_LOG_LEVEL: 'debug' }));
  // Each worker's stream delivered its snapshot: the frontends' indexes follow from here.
  for (const f of frontends) for (const w of workers) await f.waitForEvent('kv_stream_connected', (l) => l.worker_id === w.workerId);
  return { workers, frontends };
}

/** Reads one counter or gauge sample from a Prometheus text page; 0 when absent. */
export async function metricValue(url: string, name: string, labels = ''): Promise<number> {
  return (await metricValues(url, [labels ? `${name}{${labels}}` : name]))[0] ?? 0;
}

/**
 * Samples (`name` or `name{labels}`) from one scrape of a Prometheus text page, undefined where
 * absent. One scrape matters where reading resets what is read (prom-client's event-loop histogram).
 */
export async function metricValues(url: string, keys: string[]): Promise<Array<number | undefined>> {
  const lines = (await fetch(`${url}/metrics`).then((r) => r.text())).split('\n');
  return keys.map((key) => {
    const line = lines.find((l) => l.startsWith(key + ' '));
    return line === undefined ? undefined : Number(line.slice(key.length + 1));
  });
}

/** The sum of every sample of `name`, whatever its labels (a counter per adapter, per reason); 0 when absent. */
export async function metricSum(url: string, name: string): Promise<number> {
  const lines = (await fetch(`${url}/metrics`).then((r) => r.text())).split('\n');
  return lines.filter((l) => l.startsWith(`${name} `) || l.startsWith(`${name}{`)).reduce((sum, l) => sum + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
}
