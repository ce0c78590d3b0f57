import { pino, type Logger } from 'pino';
import pretty from 'pino-pretty';
import { printable } from './terminal-text.js';

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

/** One line a person reads: time, level, component, message; the fields stay in the JSON form. */
export function prettyOptions(): pretty.PrettyOptions {
  return {
    colorize: process.stdout.isTTY === true,
    translateTime: 'SYS:HH:MM:ss.l',
    ignore: 'pid,hostname,component,worker_id,event',
    // A message can quote a worker id or a reason from elsewhere: shown escaped (see terminal-text).
    messageFormat: (log, messageKey) => printable(`${String(log.component ?? '')}: ${String(log[messageKey] ?? '')}`),
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
