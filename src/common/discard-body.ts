import type { Readable } from 'node:stream';

/**
 * Drops a response body nobody will read. undici's body emits `RequestAbortedError` when it is
 * destroyed unread, and with no listener that error is uncaught: one non-200 answer from a worker
 * (a subscriber cap, a listener at its budget, a stale discovery URL's 404) crashed the frontend.
 */
export function discardBody(body: Readable): void {
  if (body.destroyed) return;
  body.on('error', ignore);
  body.destroy();
}

function ignore(): void {}
