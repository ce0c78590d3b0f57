/** Small HTTP helpers for tests: JSON calls and NDJSON/SSE stream readers over real sockets. */

export interface JsonResponse<T = any> {
  status: number;
  headers: Headers;
  body: T;
}

export async function call<T = any>(method: string, url: string, body?: unknown, headers: Record<string, string> = {}): Promise<JsonResponse<T>> {
  const res = await fetch(url, {
    method,
    headers: body === undefined ? headers : { 'content-type': 'application/json', ...headers },
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    /* not JSON: keep the text for the assertion message */
  }
  return { status: res.status, headers: res.headers, body: parsed as T };
}

/** Yields the non-empty pieces of a response body split on `separator` (NDJSON lines, SSE events). */
export async function* splitBody(body: AsyncIterable<Uint8Array>, separator: string): AsyncGenerator<string, void, void> {
  const decoder = new TextDecoder();
  let buffer = '';
  for await (const chunk of body) {
    buffer += decoder.decode(chunk, { stream: true });
    let i: number;
    while ((i = buffer.indexOf(separator)) >= 0) {
      const piece = buffer.slice(0, i).trim();
      buffer = buffer.slice(i + separator.length);
      if (piece !== '') yield piece;
    }
  }
  if (buffer.trim() !== '') yield buffer.trim();
}

/** A running stream: `first` resolves on the first line; `done` with every line once it ends. */
export interface OpenStream {
  status: number;
  first: Promise<string>;
  done: Promise<string[]>;
  abort(): void;
}

export async function openLineStream(url: string, body: unknown, separator = '\n'): Promise<OpenStream> {
  const controller = new AbortController();
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal: controller.signal,
  });
  let resolveFirst!: (line: string) => void;
  let rejectFirst!: (err: unknown) => void;
  const first = new Promise<string>((res, rej) => {
    resolveFirst = res;
    rejectFirst = rej;
  });
  first.catch(() => undefined);
  const done = (async () => {
    const lines: string[] = [];
    if (!res.body) return lines;
    try {
      for await (const line of splitBody(res.body as AsyncIterable<Uint8Array>, separator)) {
        if (lines.length === 0) resolveFirst(line);
        lines.push(line);
      }
    } catch (err) {
      rejectFirst(err);
      throw err;
    }
    if (lines.length > 0) resolveFirst(lines[0] as string);
    else rejectFirst(new Error('stream ended without a line'));
    return lines;
  })();
  done.catch(() => undefined);
  return { status: res.status, first, done, abort: () => controller.abort() };
}
