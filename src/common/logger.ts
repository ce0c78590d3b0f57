import { pino, type Logger } from 'pino';

export type { Logger };

/** JSON logs on stdout; EBB_LOG_LEVEL overrides the level (tests set it to keep output small). */
export function createLogger(component: string, bindings: Record<string, unknown> = {}): Logger {
  return pino({
    level: process.env.EBB_LOG_LEVEL ?? 'info',
    base: { component, pid: process.pid, ...bindings },
    timestamp: pino.stdTimeFunctions.isoTime,
  });
}
