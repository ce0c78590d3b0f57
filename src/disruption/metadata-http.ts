import { request } from 'undici';
import { readBounded } from '../common/bounded-read.js';

/** What a metadata endpoint answered. */
export interface MetadataAnswer {
  status: number;
  text: string;
  headers: Record<string, string | string[] | undefined>;
}

/** Metadata answers are a few hundred bytes; anything much larger is not one. */
const MAX_BYTES = 256 * 1024;

/**
 * One call to a metadata endpoint (link-local, answering in milliseconds), bounded as a whole so a
 * black-holed endpoint is an error and never a stuck poller; a long-poll passes its own bound.
 */
export async function metadataCall(
  url: string,
  { method = 'GET', headers = {}, body, timeoutMs, signal }: { method?: 'GET' | 'PUT' | 'POST'; headers?: Record<string, string>; body?: string; timeoutMs: number; signal?: AbortSignal | undefined },
): Promise<MetadataAnswer> {
  const bound = AbortSignal.timeout(timeoutMs);
  const all = signal ? AbortSignal.any([bound, signal]) : bound;
  try {
    const res = await request(url, { method, headers, body, signal: all, headersTimeout: timeoutMs, bodyTimeout: timeoutMs });
    return { status: res.statusCode, text: await readBounded(res.body, MAX_BYTES, { cut: true }), headers: res.headers };
  } catch (err) {
    if (bound.aborted) throw new Error(`${method} ${url}: no answer within ${timeoutMs} ms`);
    throw new Error(`${method} ${url}: ${(err as Error).message}`);
  }
}

/** A time the platform wrote (ISO 8601, or RFC 1123 as AWS and Azure write theirs); undefined when unreadable. */
export function parseTime(v: unknown): number | undefined {
  if (typeof v !== 'string' || v.trim() === '') return undefined;
  const t = Date.parse(v);
  return Number.isFinite(t) ? t : undefined;
}
