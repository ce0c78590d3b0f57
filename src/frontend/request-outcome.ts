import type { ServerResponse } from 'node:http';
import { traceStreamFailure } from '../tracing/request-trace.js';

/**
 * How a public API request ended, as the request metrics label it: `ok`, `invalid` (a 4xx of the
 * client's), `shed` (429: the queue full or timed out), `unavailable` (503: no worker, the frontend
 * closing), `error` (another 5xx, or a stream that ended with an error event), `client_gone` (the
 * client closed before its answer ended).
 */
export type RequestOutcome = 'ok' | 'invalid' | 'shed' | 'unavailable' | 'error' | 'client_gone';
export const REQUEST_OUTCOMES: readonly RequestOutcome[] = ['ok', 'invalid', 'shed', 'unavailable', 'error', 'client_gone'];

/** Responses whose stream ended with an error event after its 200 (set on failure paths only). */
const failedStreams = new WeakSet<ServerResponse>();

/** The stream on `res` ended with error `code` (an SSE error event): its request's outcome is `error`, its span says why. */
export function streamFailed(res: ServerResponse, code: string, message: string): void {
  failedStreams.add(res);
  traceStreamFailure(res, code, message);
}

/** What `res`'s request came to, once it closed. */
export function outcomeOf(res: ServerResponse): RequestOutcome {
  const status = res.statusCode;
  if (status === 429) return 'shed';
  if (status === 503) return 'unavailable';
  if (status >= 500) return 'error';
  if (status >= 400) return 'invalid';
  if (failedStreams.has(res)) return 'error';
  return res.writableFinished ? 'ok' : 'client_gone';
}
