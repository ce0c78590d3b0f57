import { pino, type Logger } from 'pino';
import pretty from 'pino-pretty';

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
    messageFormat: (line, messageKey) => `${source(line)}: ${String(line[messageKey] ?? '')}`,
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
  return logFormat() === 'pretty' ? pino(opts, pretty(prettyOptions())) : pino(opts);
}
