import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createServer } from 'node:net';
import { createInterface } from 'node:readline';
import type { Logger } from 'pino';

/** How the engine child ended: its exit code, or the signal that ended it. */
export interface EngineExit {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** Set when the command could not be started at all (no such file, not executable). */
  error?: string;
}

/** "code 1", "SIGKILL", or why it never ran. */
export function describeExit(e: EngineExit): string {
  return e.error ?? e.signal ?? `code ${e.code}`;
}

/**
 * Splits a command line into argv the way a shell would for plain words and quotes ('...', "...",
 * backslash escapes), without a shell: the signals ebb sends must reach the engine itself, not a
 * `sh -c` in between that may not pass them on.
 */
export function splitCommand(line: string): string[] {
  const words: string[] = [];
  let word = '';
  let inWord = false;
  let quote: '"' | "'" | null = null;
  for (let i = 0; i < line.length; i++) {
    const c = line[i] as string;
    if (quote === "'") {
      if (c === "'") quote = null;
      else word += c;
    } else if (quote === '"') {
      if (c === '"') quote = null;
      else if (c === '\\' && (line[i + 1] === '"' || line[i + 1] === '\\')) word += line[++i];
      else word += c;
    } else if (c === "'" || c === '"') {
      quote = c;
      inWord = true;
    } else if (c === '\\' && i + 1 < line.length) {
      word += line[++i];
      inWord = true;
    } else if (/\s/.test(c)) {
      if (inWord) words.push(word);
      word = '';
      inWord = false;
    } else {
      word += c;
      inWord = true;
    }
  }
  if (quote !== null) throw new Error(`--engine-cmd has an unterminated ${quote} quote`);
  if (inWord) words.push(word);
  return words;
}

/**
 * A free TCP port on loopback, for `{port}`. Another process could take it between this check
 * and the engine binding it; the engine then fails to start and says so (a clear error, no hang).
 */
export async function freePort(): Promise<number> {
  const server = createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as { port: number }).port;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/**
 * The engine server as the worker's child (--engine-cmd). It runs in its own process group: a
 * Ctrl-C at the terminal reaches the worker, which drains first and only then stops the engine;
 * the stop signals go to the whole group, so an engine's own helper processes stop with it.
 */
export class EngineProcess {
  readonly child: ChildProcess;
  readonly argv: string[];
  /** Settles once the child has exited, however it ended. */
  readonly exited: Promise<EngineExit>;
  private stopping = false;
  private exit: EngineExit | undefined;
  private readonly failureListeners = new Set<(err: Error) => void>();
  private readonly killOnExit = () => this.signalGroup('SIGKILL');

  constructor(
    readonly command: string,
    private readonly log: Logger,
  ) {
    this.argv = splitCommand(command);
    const [file, ...args] = this.argv;
    if (file === undefined) throw new Error('--engine-cmd is empty');
    // stdin is a pipe nobody writes to: it closes when the worker dies, however it dies, for engines that watch it.
    this.child = spawn(file, args, { stdio: ['pipe', 'pipe', 'pipe'], detached: true });
    const label = `[engine ${this.child.pid ?? '?'}] `;
    for (const stream of [this.child.stdout, this.child.stderr]) {
      if (stream) createInterface({ input: stream }).on('line', (line) => process.stderr.write(label + line + '\n'));
    }
    this.exited = new Promise<EngineExit>((resolve) => {
      this.child.once('exit', (code, signal) => {
        this.exit = { code, signal };
        process.off('exit', this.killOnExit);
        resolve(this.exit);
        if (!this.stopping) this.failed(new Error(`the engine exited on its own (${describeExit(this.exit)}): ${command}`));
      });
      // Spawning itself failed (no such file): reported like an exit, with the reason.
      this.child.once('error', (err) => {
        if (this.exit !== undefined) return;
        this.exit = { code: null, signal: null, error: `could not be started: ${err.message}` };
        resolve(this.exit);
        if (!this.stopping) this.failed(new Error(`the engine command could not be started (${err.message}): ${command}`));
      });
    });
    // A worker that exits without close() (a fatal error, the shutdown watchdog) takes its engine with it.
    process.on('exit', this.killOnExit);
    log.info({ event: 'engine_started', pid: this.child.pid, command }, `engine started (pid ${this.child.pid}): ${command}`);
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  /** Set when the child has exited. */
  get exitStatus(): EngineExit | undefined {
    return this.exit;
  }

  /** The child exited without being asked to. */
  onFailure(listener: (err: Error) => void): () => void {
    this.failureListeners.add(listener);
    return () => this.failureListeners.delete(listener);
  }

  private failed(err: Error): void {
    this.log.error({ event: 'engine_exited', pid: this.child.pid, ...this.exit }, err.message);
    for (const l of this.failureListeners) l(err);
  }

  private signalGroup(signal: NodeJS.Signals): void {
    if (this.exit !== undefined || this.child.pid === undefined) return;
    try {
      process.kill(-this.child.pid, signal);
    } catch {
      this.child.kill(signal); // the group is gone already; the child may still be reaped
    }
  }

  /** SIGTERM, then SIGKILL once `timeoutMs` passed: an engine that hangs on exit cannot hold the worker. */
  async stop(timeoutMs: number): Promise<EngineExit> {
    this.stopping = true;
    if (this.exit !== undefined) return this.exit;
    const started = performance.now();
    this.log.info({ event: 'engine_stopping', pid: this.child.pid, timeout_ms: timeoutMs }, `stopping the engine (SIGTERM, SIGKILL after ${timeoutMs} ms)`);
    this.signalGroup('SIGTERM');
    let forced = false;
    const timer = setTimeout(() => {
      forced = true;
      this.log.warn({ event: 'engine_stop_forced', pid: this.child.pid }, `the engine did not exit within ${timeoutMs} ms of SIGTERM: SIGKILL`);
      this.signalGroup('SIGKILL');
    }, timeoutMs);
    const exit = await this.exited;
    clearTimeout(timer);
    this.log.info({ event: 'engine_stopped', pid: this.child.pid, ...exit, forced, seconds: (performance.now() - started) / 1000 }, 'engine stopped');
    return exit;
  }
}
