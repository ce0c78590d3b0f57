import type { Logger } from 'pino';
import { startTracing, stopTracing, tracing } from '../tracing/tracing.js';
import { CliError } from './cli-error.js';

/** Starts the process's tracing when it is asked for (docs/observability.md); a setting it cannot honour stops the start with why. */
export async function startTracingOr(log: Logger, service: string, instance: string): Promise<void> {
  try {
    await startTracing(service, instance, log);
  } catch (err) {
    throw new CliError(`tracing: ${(err as Error).message}`);
  }
}

/**
 * Exits with `code`: at once (as process.exit) with tracing off; with it on, once the spans not
 * yet exported are (at most 2 s): a caller that goes on after it must return.
 */
export function exitTraced(code: number): void {
  if (tracing() === undefined) process.exit(code);
  void stopTracing(2000).finally(() => process.exit(code));
}
