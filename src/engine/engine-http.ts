import { request, type Dispatcher } from 'undici';
import { readBounded } from '../common/bounded-read.js';

/** What a bounded GET read: the status and the body text (cut at the limit). */
export interface BoundedAnswer {
  status: number;
  text: string;
}

/** Thrown when the engine did not answer within the bound (as opposed to answering with an error). */
export class EngineTimeout extends Error {}

/**
 * GET with a hard bound on the whole exchange (headers and body) and on the body size: an engine
 * page that is slow or huge must never stall a probe or the worker's memory.
 */
export function getBounded(url: string, dispatcher: Dispatcher, timeoutMs: number, maxBytes = 4 << 20, signal?: AbortSignal): Promise<BoundedAnswer> {
  return requestBounded(url, dispatcher, timeoutMs, { maxBytes, signal });
}

/** Any method, bounded as getBounded is; `json` is sent as the body. */
export async function requestBounded(
  url: string,
  dispatcher: Dispatcher,
  timeoutMs: number,
  { method = 'GET', json, maxBytes = 4 << 20, signal }: { method?: 'GET' | 'POST'; json?: unknown; maxBytes?: number; signal?: AbortSignal | undefined },
): Promise<BoundedAnswer> {
  const bound = AbortSignal.timeout(timeoutMs);
  const all = signal ? AbortSignal.any([bound, signal]) : bound;
  const body = json === undefined ? {} : { headers: { 'content-type': 'application/json' }, body: JSON.stringify(json) };
  try {
    const res = await request(url, { method, ...body, dispatcher, signal: all, headersTimeout: timeoutMs, bodyTimeout: timeoutMs });
    return { status: res.statusCode, text: await readBounded(res.body, maxBytes, { cut: true }) };
  } catch (err) {
    if (bound.aborted) throw new EngineTimeout(`${method} ${url} did not answer within ${timeoutMs} ms`);
    throw err;
  }
}

/** One line naming what failed: undici's errors carry the useful part in `code` or `cause`. */
export function describeError(err: unknown): string {
  const e = err as (Error & { code?: string; cause?: { code?: string; message?: string } }) | undefined;
  const code = e?.code ?? e?.cause?.code;
  const msg = e?.message ?? String(err);
  return code && !msg.includes(code) ? `${msg} (${code})` : msg;
}
