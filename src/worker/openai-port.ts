import type { Logger } from 'pino';
import type { AdminGuard } from '../common/admin-auth.js';
import type { Discovery, WorkerRecord } from '../discovery/discovery.js';
import { startFrontend, type RunningFrontend } from '../frontend/frontend.js';
import { CLEANUP_RESERVE_MS } from './shutdown.js';

/** `ebb worker --openai-port`: where, and the client keys its /v1/ routes need (none: open, as the frontend's default). */
export interface OpenAIPortOptions {
  host: string;
  port: number;
  apiGuard?: AdminGuard | undefined;
}

/**
 * The frontend's OpenAI API for this worker alone, for a picker (an InferencePool's endpoint picker)
 * that forwards the client's OpenAI request to the pod it chose. Its routing view is `own`: the
 * worker's registration mirrored in-process (in once discovery confirmed it, out before discovery is
 * told), so a drain empties it at once and a request is a retryable 503. Requests reach the worker's
 * request plane over one loopback HTTP hop with the fleet's request token, through its admission
 * like any frontend's: counted in flight, waited for by a drain, refused once draining. Nothing
 * migrates (there is no other worker), no stream is kept for resumption, and nothing queues: a
 * refusal is answered at once, for the picker to send the request to another pod.
 */
export function startOpenAIPort(opts: OpenAIPortOptions, own: Discovery, record: WorkerRecord, requestToken: string | undefined, log: Logger): Promise<RunningFrontend> {
  return startFrontend(
    { host: opts.host, port: opts.port, discoveryUrl: own.url, own: { discovery: own, record }, router: 'least-loaded', requestToken, apiGuard: opts.apiGuard, queueTimeoutMs: 0 },
    log.child({ component: 'openai-port' }),
  );
}

/**
 * In the worker's cleanup, once its own streams are over: the port's streams end with them, so this
 * is quick; when `signal` aborts first, whatever is left ends now with server_closing.
 */
export async function closeOpenAIPort(port: RunningFrontend, signal: AbortSignal): Promise<void> {
  const cut = () => void port.interrupt('the worker is shutting down; retry').catch(() => undefined);
  if (signal.aborted) cut();
  else signal.addEventListener('abort', cut, { once: true });
  try {
    await port.close(CLEANUP_RESERVE_MS);
  } finally {
    signal.removeEventListener('abort', cut);
  }
}
