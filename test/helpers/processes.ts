import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, dirname } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

export const CLI = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'src', 'cli', 'main.js');

export type LogLine = Record<string, unknown> & { event?: string };

/** Bound on any single wait in tests, so a broken behaviour fails instead of hanging. */
export const WAIT_BOUND_MS = 20_000;

export class EbbProcess {
  readonly logs: LogLine[] = [];
  readonly stderr: string[] = [];
  private readonly exited: Promise<number>;
  private waiters: Array<{ pred: (l: LogLine) => boolean; resolve: (l: LogLine) => void }> = [];

  constructor(readonly proc: ChildProcess, readonly label: string) {
    createInterface({ input: proc.stdout! }).on('line', (line) => {
      let parsed: LogLine;
      try {
        parsed = JSON.parse(line) as LogLine;
      } catch {
        parsed = { msg: line };
      }
      this.logs.push(parsed);
      this.waiters = this.waiters.filter((w) => {
        if (!w.pred(parsed)) return true;
        w.resolve(parsed);
        return false;
      });
    });
    createInterface({ input: proc.stderr! }).on('line', (line) => this.stderr.push(line));
    this.exited = once(proc, 'exit').then(([code, signal]) => (code ?? (signal ? 128 : -1)) as number);
  }

  /** Resolves with the first log line (past or future) matching `pred`. */
  waitForLog(pred: (l: LogLine) => boolean, what = 'log line'): Promise<LogLine> {
    const seen = this.logs.find(pred);
    if (seen) return Promise.resolve(seen);
    return bounded(
      new Promise<LogLine>((resolve) => this.waiters.push({ pred, resolve })),
      `${this.label}: waiting for ${what}; stderr: ${this.stderr.join('\n')}`,
    );
  }

  waitForEvent(event: string, extra: (l: LogLine) => boolean = () => true): Promise<LogLine> {
    return this.waitForLog((l) => l.event === event && extra(l), `event ${event}`);
  }

  exitCode(boundMs = WAIT_BOUND_MS): Promise<number> {
    return bounded(this.exited, `${this.label}: waiting for exit`, boundMs);
  }

  signal(sig: NodeJS.Signals): void {
    this.proc.kill(sig);
  }

  async stop(): Promise<void> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    this.proc.kill('SIGKILL');
    await this.exited;
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

export function spawnEbb(args: string[], label: string, env: NodeJS.ProcessEnv = {}): EbbProcess {
  const proc = spawn(process.execPath, [CLI, ...args], {
    env: { ...process.env, EBB_LOG_LEVEL: 'info', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  return new EbbProcess(proc, label);
}

export interface WorkerHandle extends EbbProcess {
  workerId: string;
  requestUrl: string;
  systemUrl: string;
}

export function tempDiscoveryUrl(): string {
  return `file://${mkdtempSync(join(tmpdir(), 'ebb-test-discovery-'))}`;
}

export async function startWorker(args: string[], env: NodeJS.ProcessEnv = {}): Promise<WorkerHandle> {
  const p = spawnEbb(['worker', '--port', '0', '--system-port', '0', ...args], 'worker', env);
  const ready = await p.waitForEvent('worker_ready');
  return Object.assign(p, {
    workerId: ready.worker_id as string,
    requestUrl: ready.request_url as string,
    systemUrl: ready.system_url as string,
  }) as WorkerHandle;
}

export interface FrontendHandle extends EbbProcess {
  url: string;
}

export async function startFrontend(discoveryUrl: string, args: string[] = []): Promise<FrontendHandle> {
  const p = spawnEbb(['frontend', '--port', '0', '--discovery', discoveryUrl, ...args], 'frontend');
  const ready = await p.waitForEvent('frontend_ready');
  return Object.assign(p, { url: ready.url as string }) as FrontendHandle;
}

/** Reads one counter or gauge sample from a Prometheus text page; 0 when absent. */
export async function metricValue(url: string, name: string, labels = ''): Promise<number> {
  const text = await fetch(`${url}/metrics`).then((r) => r.text());
  const key = labels ? `${name}{${labels}}` : name;
  const line = text.split('\n').find((l) => l.startsWith(key + ' '));
  return line ? Number(line.slice(key.length + 1)) : 0;
}
