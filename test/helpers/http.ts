/** Small HTTP helpers for tests: JSON calls, NDJSON/SSE stream readers, fake workers and raw sockets. */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { renameSync, writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

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

/**
 * A response's SSE events as their raw text, whole events only (a cut's partial event is none), each
 * given to `onEvent` as it comes: one for which it returns true ends the read there (aborting
 * `controller`, which closes the connection). A read that fails (a cut) throws, unless `controller`
 * was aborted or `keepOnCut`: then the events before the cut are the answer, as a client had them.
 */
export async function sseEvents(res: Response, onEvent: (e: string) => boolean | void = () => undefined, opts: { controller?: AbortController | undefined; keepOnCut?: boolean } = {}): Promise<string[]> {
  const out: string[] = [];
  const decoder = new TextDecoder();
  let buf = '';
  try {
    for await (const chunk of res.body as AsyncIterable<Uint8Array>) {
      buf += decoder.decode(chunk, { stream: true });
      let end: number;
      while ((end = buf.indexOf('\n\n')) >= 0) {
        const event = buf.slice(0, end);
        buf = buf.slice(end + 2);
        out.push(event);
        if (onEvent(event) === true) {
          opts.controller?.abort();
          return out;
        }
      }
    }
  } catch (err) {
    if (opts.keepOnCut !== true && opts.controller?.signal.aborted !== true) throw err;
  }
  return out;
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

export interface SeenRequest {
  method: string;
  url: string;
  authorization: string | undefined;
  body: string;
}

/** An HTTP server in the test process standing in for a worker (request plane and system server in one). */
export interface FakeWorker {
  url: string;
  seen: SeenRequest[];
  /** Connections accepted so far. */
  connections: number;
  close(): Promise<void>;
}

export async function fakeWorker(handle: (req: SeenRequest, res: ServerResponse, raw: IncomingMessage) => void): Promise<FakeWorker> {
  const seen: SeenRequest[] = [];
  const fake = { url: '', seen, connections: 0, close: async () => undefined } as FakeWorker;
  const server = createServer((req, res) => {
    let body = '';
    req.setEncoding('utf8');
    req.on('data', (c: string) => (body += c));
    req.on('end', () => {
      const r = { method: req.method ?? '', url: req.url ?? '', authorization: req.headers.authorization, body };
      seen.push(r);
      handle(r, res, req);
    });
  });
  server.on('connection', () => fake.connections++);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as { port: number }).port;
  fake.url = `http://127.0.0.1:${port}`;
  fake.close = () =>
    new Promise<void>((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    });
  return fake;
}

export function json(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}

/**
 * Puts a worker record straight into a file: discovery directory, owned by this (live) test process
 * with a long lease, as if a worker had registered it.
 */
export function injectRecord(
  discoveryUrl: string,
  record: { worker_id: string; model: string; mode?: string; request_url: string; system_url: string; engine?: string; capabilities?: Record<string, unknown>; kv_cache?: Record<string, unknown> },
): void {
  const dir = fileURLToPath(discoveryUrl);
  const path = join(dir, `${encodeURIComponent(record.worker_id)}.json`);
  const entry = { record: { mode: 'aggregated', ...record }, pid: process.pid, hostname: hostname(), heartbeat_at: Date.now(), ttl_ms: 300_000, registered_at: Date.now() };
  writeFileSync(`${path}.tmp`, JSON.stringify(entry));
  renameSync(`${path}.tmp`, path);
}

/** A raw TCP connection to an HTTP listener, collecting everything it receives until the server closes it. */
export interface RawConnection {
  socket: Socket;
  /** Resolves with all bytes received once the connection closed. */
  closed: Promise<string>;
}

export async function rawConnect(url: string): Promise<RawConnection> {
  const { hostname: host, port } = new URL(url);
  const socket = connect(Number(port), host.replace(/^\[|\]$/g, ''));
  await new Promise<void>((resolve, reject) => {
    socket.once('connect', resolve);
    socket.once('error', reject);
  });
  let received = '';
  socket.setEncoding('utf8');
  socket.on('data', (c: string) => (received += c));
  const closed = new Promise<string>((resolve) => {
    socket.on('error', () => undefined);
    socket.on('close', () => resolve(received));
  });
  return { socket, closed };
}

/** Status code and parsed JSON body of a raw HTTP/1.1 response text. */
export function parseRawResponse(text: string): { status: number; headers: string; body: any } {
  // Informational (1xx) answers before the response are skipped, as HTTP clients do.
  while (/^HTTP\/1\.1 1\d\d /.test(text) && text.includes('\r\n\r\n')) text = text.slice(text.indexOf('\r\n\r\n') + 4);
  const split = text.indexOf('\r\n\r\n');
  const head = split < 0 ? text : text.slice(0, split);
  const rest = split < 0 ? '' : text.slice(split + 4);
  const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1] ?? 0);
  let body: unknown = rest;
  try {
    body = JSON.parse(rest);
  } catch {
    /* chunked or not JSON: keep the text */
  }
  return { status, headers: head, body };
}

/**
 * A slowloris that never reads: request headers sent a byte every `everyMs`, never finished, while
 * the socket's receive side stays paused. Resolves once the server closed the connection.
 */
export async function dripHeaders(url: string, everyMs = 50): Promise<{ closed: Promise<void> }> {
  const { socket, closed } = await rawConnect(url);
  socket.pause();
  const text = `GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\nx-drip: ${'a'.repeat(100_000)}`;
  let i = 0;
  const drip = setInterval(() => {
    if (socket.writable) socket.write(text[i++ % text.length]!);
  }, everyMs);
  return { closed: closed.then(() => clearInterval(drip)) };
}

/**
 * POSTs `bytes` of body to `url` on a raw socket, all at once (more than the kernel buffers hold),
 * and reads the answer while still sending. Resolves with the answer once it is whole (by its
 * content-length), and with the socket error when the server reset the connection instead.
 */
export async function postOversize(url: string, path: string, bytes: number): Promise<{ answer: string; socketError?: string }> {
  const { hostname: host, port } = new URL(url);
  const socket = connect(Number(port), host.replace(/^\[|\]$/g, ''));
  let received = '';
  let socketError: string | undefined;
  const whole = new Promise<void>((resolve) => {
    socket.setEncoding('utf8');
    socket.on('data', (c: string) => {
      received += c;
      const split = received.indexOf('\r\n\r\n');
      const length = /content-length: (\d+)/i.exec(received.slice(0, split))?.[1];
      if (split >= 0 && length !== undefined && Buffer.byteLength(received.slice(split + 4)) >= Number(length)) resolve();
    });
    socket.on('error', (err: NodeJS.ErrnoException) => {
      socketError = err.code ?? err.message;
      resolve();
    });
    socket.on('close', () => resolve());
  });
  socket.write(`POST ${path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: ${bytes}\r\n\r\n`);
  socket.write(Buffer.alloc(bytes, 'a'));
  await whole;
  // Written out, or failed: a reset surfaces on the write side too.
  await new Promise<void>((resolve) => (socket.writableLength === 0 || socket.destroyed ? resolve() : socket.once('drain', resolve).once('close', resolve)));
  socket.destroy();
  return { answer: received, ...(socketError === undefined ? {} : { socketError }) };
}
