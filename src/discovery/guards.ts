/**
 * Containment for discovery's background work (watch callbacks, timers, listeners): a failure there
 * must never become an unhandled rejection or an uncaught exception, both of which end the process.
 */

/** Resolves when `work` settles or after `ms`, whichever is first; never rejects. */
export async function bounded(work: Promise<unknown>, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([
    work.catch(() => undefined),
    new Promise<void>((resolve) => {
      timer = setTimeout(resolve, ms);
    }),
  ]);
  clearTimeout(timer);
}

/** Discovery has no logger of its own; a warning reaches stderr without disturbing the JSON log. */
export function warn(what: string, err: unknown): void {
  process.emitWarning(`discovery: ${what}: ${err instanceof Error ? err.message : String(err)}`, 'EbbDiscoveryWarning');
}

/** Runs a callback handed to discovery by its user. A throwing listener is a bug there, not a reason to stop. */
export function callListener<A extends unknown[]>(what: string, listener: (...args: A) => void, ...args: A): void {
  try {
    listener(...args);
  } catch (err) {
    warn(`${what} listener threw`, err);
  }
}
