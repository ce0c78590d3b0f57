import { once } from 'node:events';
import type { ServerResponse } from 'node:http';

/**
 * Writes with backpressure. The wait for 'drain' ends when `signal` aborts (the peer went away):
 * a socket closed while full never drains, and waiting on it would pin the request forever.
 */
export async function writeWithBackpressure(res: ServerResponse, chunk: string, signal: AbortSignal): Promise<void> {
  if (!res.write(chunk)) await once(res, 'drain', { signal });
}
