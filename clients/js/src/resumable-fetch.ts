/**
 * `resumableFetch()`: a `fetch` for any OpenAI SDK that asks ebb to keep each stream and, when one is
 * cut (a frontend restarting, a load balancer or a network dropping the connection), resumes it at the
 * same base URL and splices the rest into the same body. The SDK sees one whole stream.
 */
import { RESUMABLE_HEADER, streamTargetOf } from './ebb-streams.js';
import { ResumableBody, type ResumeEvent } from './resumable-body.js';
import { isEventStream } from './resume-request.js';

export interface ResumableFetchOptions {
  /** The fetch that does the requests (default: the global `fetch`). */
  fetch?: typeof fetch;
  /** Resume tries per cut before the SDK gets the original error (default 8). A resumed connection that delivers an event earns a fresh set. */
  retries?: number;
  /** The pause in ms before resume try `attempt` (0-based) of a cut (default: none before the first, then 100 ms doubling to 2 s, jittered). */
  backoffMs?: (attempt: number) => number;
  /** Told of every resume try and its outcome: for logs and metrics. */
  onResume?: (event: ResumeEvent) => void;
}

const DEFAULT_RETRIES = 8;

/** No pause before the first try (a frontend's hand-on is resumed at once), then 100 ms doubling to 2 s, each between half and all of it. */
export function defaultBackoffMs(attempt: number): number {
  if (attempt <= 0) return 0;
  const ceiling = Math.min(2000, 100 * 2 ** (attempt - 1));
  return ceiling * (0.5 + Math.random() / 2);
}

export function resumableFetch(options: ResumableFetchOptions = {}): typeof fetch {
  const retries = options.retries ?? DEFAULT_RETRIES;
  if (!Number.isInteger(retries) || retries < 0) throw new RangeError(`retries must be a whole number >= 0, not ${retries}`);
  const backoffMs = options.backoffMs ?? defaultBackoffMs;
  return async function ebbFetch(input: string | URL | Request, init?: RequestInit): Promise<Response> {
    const underlying = options.fetch ?? globalThis.fetch;
    const request = input instanceof Request ? input : undefined;
    const method = (init?.method ?? request?.method ?? 'GET').toUpperCase();
    const url = parseUrl(request?.url ?? String(input));
    const target = url === undefined ? undefined : streamTargetOf(method, url, await bodyText(init, request, method));
    if (target === undefined) return underlying(input, init);
    const headers = new Headers(init?.headers ?? request?.headers);
    headers.set(RESUMABLE_HEADER, '1');
    const res = await underlying(input, { ...init, headers });
    // Only a stream ebb says it keeps can be resumed; anything else is the SDK's as it came.
    if (res.status !== 200 || res.body === null || res.headers.get(RESUMABLE_HEADER) !== '1' || !isEventStream(res)) return res;
    const body = new ResumableBody(target, res.body, { fetch: underlying, retries, backoffMs, onResume: options.onResume, signal: init?.signal ?? request?.signal ?? undefined, headers });
    const spliced = new Response(body.stream(), { status: res.status, statusText: res.statusText, headers: res.headers });
    Object.defineProperty(spliced, 'url', { value: res.url });
    return spliced;
  };
}

/** The request's URL; a relative one against the page's (in a browser); undefined when it is none the underlying fetch can take either. */
function parseUrl(href: string): URL | undefined {
  try {
    return new URL(href, globalThis.location?.href);
  } catch {
    return undefined;
  }
}

/** The request's JSON body as text, to see whether it asks to stream; only a POST's is read. */
async function bodyText(init: RequestInit | undefined, request: Request | undefined, method: string): Promise<string | undefined> {
  if (method !== 'POST') return undefined;
  const body = init?.body;
  if (typeof body === 'string') return body;
  if (body instanceof Uint8Array || body instanceof ArrayBuffer) return new TextDecoder().decode(body);
  if (body === undefined && request !== undefined) return request.clone().text();
  return undefined;
}
