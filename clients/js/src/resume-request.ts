/**
 * One resume try: the GET of a kept stream from after the client's last whole event, and what its
 * answer means (the stream goes on, a refusal that is final, or one that may clear), and the pause
 * before a try.
 */
import { RESUMABLE_HEADER } from './ebb-streams.js';

export type ResumeAnswer =
  | { kind: 'connected'; status: number; body: ReadableStream<Uint8Array> }
  /** `final`: 404 (expired, unknown) and the other 4xx; not final: a frontend or store down (5xx), 408, 429. */
  | { kind: 'refused'; status: number; final: boolean }
  /** No answer: the connection failed. */
  | { kind: 'failed'; error: unknown };

/** Headers of the original request that describe its body, not the caller: a GET has none. */
const BODY_HEADERS = ['content-type', 'content-length', 'last-event-id'];

export async function requestResume(
  fetch: typeof globalThis.fetch,
  url: string,
  original: Headers,
  lastEventId: string | undefined,
  signal: AbortSignal,
): Promise<ResumeAnswer> {
  // The caller's own headers go along (its credentials, its tenant): the resume is its request too.
  const headers = new Headers(original);
  for (const name of BODY_HEADERS) headers.delete(name);
  headers.set('accept', 'text/event-stream');
  headers.set(RESUMABLE_HEADER, '1');
  if (lastEventId !== undefined) headers.set('last-event-id', lastEventId);
  let res: Response;
  try {
    res = await fetch(url, { method: 'GET', headers, signal });
  } catch (error) {
    if (signal.aborted) throw error;
    return { kind: 'failed', error };
  }
  if (res.status === 200 && isEventStream(res) && res.body !== null) return { kind: 'connected', status: res.status, body: res.body };
  await res.body?.cancel().catch(() => undefined);
  return { kind: 'refused', status: res.status, final: res.status < 500 && res.status !== 408 && res.status !== 429 };
}

export function isEventStream(res: Response): boolean {
  return (res.headers.get('content-type') ?? '').toLowerCase().startsWith('text/event-stream');
}

/** Waits `ms`, or rejects at once with the signal's reason when it aborts. */
export function pause(ms: number, signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.reject(signal.reason);
  if (ms <= 0) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const done = () => {
      signal.removeEventListener('abort', aborted);
      resolve();
    };
    const aborted = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener('abort', aborted, { once: true });
  });
}
