import { createRequire } from 'node:module';
import { destination, pino, symbols, type Logger } from 'pino';
import type pretty from 'pino-pretty';
import { printable } from './terminal-text.js';

/**
 * pino-pretty, loaded only where a person reads the lines: the processes tests and `ebb up` start
 * log JSON, and every process start pays for what it loads.
 */
export const loadPretty = (): typeof pretty => createRequire(import.meta.url)('pino-pretty') as typeof pretty;

export type { Logger };

export type LogFormat = 'auto' | 'json' | 'pretty';
export const LOG_FORMATS: readonly LogFormat[] = ['auto', 'json', 'pretty'];
export const LOG_LEVELS = ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'] as const;

/** EBB_LOG_FORMAT (or --log-format): `auto` is human-readable lines on a terminal, JSON otherwise (a pipe, a log shipper). */
export function logFormat(): 'json' | 'pretty' {
  const f = process.env.EBB_LOG_FORMAT ?? 'auto';
  if (f === 'json' || f === 'pretty') return f;
  return process.stdout.isTTY ? 'pretty' : 'json';
}

/**
 * Who logged a line: the component, and for a worker its id (`worker w-1a2b3c4d`), so the lines of
 * several workers interleaved by `ebb up` say whose they are.
 */
function source(line: Record<string, unknown>): string {
  const component = String(line.component ?? '');
  return component === 'worker' && typeof line.worker_id === 'string' ? `${component} ${line.worker_id}` : component;
}

/** One line a person reads: time, level, who, message; the fields stay in the JSON form. */
export function prettyOptions(): pretty.PrettyOptions {
  return {
    colorize: process.stdout.isTTY === true,
    translateTime: 'SYS:HH:MM:ss.l',
    ignore: 'pid,hostname,component,worker_id,event',
    // A message can quote a worker id or a reason from elsewhere: shown escaped (see terminal-text).
    messageFormat: (log, messageKey) => printable(`${source(log)}: ${String(log[messageKey] ?? '')}`),
    hideObject: true,
    sync: true, // a log line written before process.exit must not be lost
  };
}

/** JSON logs on stdout (pretty on a terminal); EBB_LOG_LEVEL overrides the level (tests set it to keep output small). */
export function createLogger(component: string, bindings: Record<string, unknown> = {}): Logger {
  const opts = {
    level: process.env.EBB_LOG_LEVEL ?? 'info',
    base: { component, pid: process.pid, ...bindings },
    timestamp: pino.stdTimeFunctions.isoTime,
  };
  // Written synchronously: pino's default asynchronous stdout, flushed at exit while a write is still
  // in flight, put the last lines of a failing worker out of order (or lost them). No hot path logs
  // per request at info, so a write per line costs nothing that matters.
  const log = logFormat() === 'pretty' ? pino(opts, loadPretty()(prettyOptions())) : pino(opts, destination({ dest: 1, sync: true }));
  dropLogsWithParent(log);
  return log;
}

/**
 * A process started by `ebb up` (an IPC channel to it) logs into a pipe `ebb up` reads: when the
 * parent dies, later lines would hit a closed pipe, and the exit flush of the buffered ones retries
 * EPIPE forever (sonic-boom's flushSync loops on any write error), so the process never exits.
 * pino's own answer to EPIPE (stop writing to that stream) is applied as soon as the parent goes.
 */
function dropLogsWithParent(log: Logger): void {
  if (process.send === undefined) return;
  const out = (log as unknown as Record<symbol, unknown>)[symbols.streamSym] as { flushSync?: unknown; emit(event: 'error', err: Error): boolean } | undefined;
  if (out === undefined || typeof out.flushSync !== 'function') return; // not pino's own stdout stream
  const gone = () => void out.emit('error', Object.assign(new Error('stdout reader (the parent process) is gone'), { code: 'EPIPE' }));
  if (!process.connected) gone();
  else process.once('disconnect', gone);
}
