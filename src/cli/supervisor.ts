import { spawn, type ChildProcess } from 'node:child_process';
import { EventEmitter, once } from 'node:events';
import { createInterface } from 'node:readline';
import { Backoff } from '../common/backoff.js';

/** The program this process runs (the bundle, or tsc's main.js): each component runs the same build. */
const CLI = process.argv[1]!;

/** Restart back-off: doubles from the first, capped; reset once the component is ready again. */
const RESTART_BACKOFF = { minMs: 1000, maxMs: 30_000 };

export type ReadyLine = Record<string, unknown>;

/**
 * One ebb component `ebb up` runs as a child process (own process group, JSON logs on a pipe),
 * restarted with back-off when it exits on its own. Emits 'line' (each stdout line), 'ready' (its
 * ready log line, on every start), 'exit' (code, signal, whether a restart follows).
 */
export class Supervised extends EventEmitter {
  proc: ChildProcess | undefined;
  /** The first start's ready line; rejects if the first start exits before it. */
  readonly firstReady: Promise<ReadyLine>;
  private resolveFirst!: (l: ReadyLine) => void;
  private rejectFirst!: (err: Error) => void;
  private everReady = false;
  /** firstEvent's waits: resolved by the first start's first line of their event, rejected if it exits first. */
  private readonly awaited = new Map<string, { promise: Promise<ReadyLine>; resolve: (l: ReadyLine) => void; reject: (err: Error) => void }>();
  private started = 0;
  private stopping = false;
  private readonly backoff = new Backoff(RESTART_BACKOFF);
  private timer: NodeJS.Timeout | undefined;

  constructor(
    readonly name: string,
    private readonly args: string[],
    private readonly readyEvent: string,
    private readonly restart: boolean,
  ) {
    super();
    this.firstReady = new Promise((resolve, reject) => {
      this.resolveFirst = resolve;
      this.rejectFirst = reject;
    });
    this.firstReady.catch(() => undefined); // observed by the caller; never an unhandled rejection here
  }

  start(): void {
    // Own process group: a terminal's Ctrl-C reaches only `ebb up`, which stops children in order.
    // The IPC channel tells a child when `ebb up` died without stopping it (the child then drains).
    const proc = spawn(process.execPath, [CLI, ...this.args], {
      stdio: ['ignore', 'pipe', 'inherit', 'ipc'],
      detached: true,
      env: { ...process.env, EBB_LOG_FORMAT: 'json' }, // `ebb up` reads their lines; it formats them for the terminal itself
    });
    this.proc = proc;
    const first = ++this.started === 1;
    createInterface({ input: proc.stdout! }).on('line', (line) => {
      this.emit('line', line);
      const awaited = first && this.awaited.size > 0;
      if (!line.includes(this.readyEvent) && !awaited) return;
      try {
        const parsed = JSON.parse(line) as ReadyLine;
        if (awaited && typeof parsed.event === 'string') this.awaited.get(parsed.event)?.resolve(parsed);
        if (parsed.event !== this.readyEvent) return;
        this.backoff.reset();
        if (!this.everReady) this.resolveFirst(parsed);
        this.everReady = true;
        this.emit('ready', parsed);
      } catch {
        /* not a log line */
      }
    });
    proc.once('exit', (code, signal) => {
      const again = this.restart && this.everReady && !this.stopping;
      const exited = new Error(`${this.name} exited (${signal ?? `code ${code}`}) before it was ready`);
      if (first) for (const w of this.awaited.values()) w.reject(exited);
      if (!this.everReady) this.rejectFirst(exited);
      const delay = again ? this.backoff.next() : undefined;
      this.emit('exit', code, signal, delay);
      if (delay === undefined) return;
      this.timer = setTimeout(() => {
        this.timer = undefined;
        if (!this.stopping) this.start();
      }, delay);
    });
  }

  /**
   * The first start's first log line of `event` (a worker's `loading_announced`, before it is
   * ready); rejects if that start exits before it. Ask before start(): lines are not kept.
   */
  firstEvent(event: string): Promise<ReadyLine> {
    let w = this.awaited.get(event);
    if (w === undefined) {
      let resolve!: (l: ReadyLine) => void;
      let reject!: (err: Error) => void;
      const promise = new Promise<ReadyLine>((res, rej) => ((resolve = res), (reject = rej)));
      promise.catch(() => undefined);
      this.awaited.set(event, (w = { promise, resolve, reject }));
    }
    return w.promise;
  }

  get running(): boolean {
    return this.proc !== undefined && this.proc.exitCode === null && this.proc.signalCode === null;
  }

  /** Stops it for good: no restart; resolves once the process has exited. */
  async stop(signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
    this.stopping = true;
    clearTimeout(this.timer);
    const proc = this.proc;
    if (!proc || !this.running) return;
    const exited = once(proc, 'exit');
    proc.kill(signal);
    await exited;
  }

  /**
   * The forced stop of a child that must still answer its clients (the frontend): asked over the IPC
   * channel, since a signal it already got once means "stop gently". Resolves once it exited, or after
   * `boundMs` (the caller then kills it).
   */
  async interrupt(boundMs: number): Promise<void> {
    this.stopping = true;
    clearTimeout(this.timer);
    const proc = this.proc;
    if (!proc || !this.running || !proc.connected) return;
    const exited = once(proc, 'exit');
    proc.send({ type: 'interrupt' });
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([exited, new Promise((resolve) => (timer = setTimeout(resolve, boundMs)))]);
    clearTimeout(timer);
  }

  kill(): void {
    this.stopping = true;
    clearTimeout(this.timer);
    if (this.running) this.proc?.kill('SIGKILL');
  }
}
