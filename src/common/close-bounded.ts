import type { FastifyInstance } from 'fastify';

/**
 * Closes a server within a bound: idle keep-alive connections at once, and whatever is still open
 * (a stalled admin call, a client that never finishes its request) when `signal` aborts. A close
 * that waits on its slowest peer is a shutdown without a bound.
 */
export async function closeBounded(app: FastifyInstance, signal: AbortSignal): Promise<void> {
  const force = () => app.server.closeAllConnections();
  if (signal.aborted) force();
  else signal.addEventListener('abort', force, { once: true });
  const closing = app.close();
  app.server.closeIdleConnections();
  try {
    await closing;
  } finally {
    signal.removeEventListener('abort', force);
  }
}
