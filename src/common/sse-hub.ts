import type { FastifyInstance, FastifyReply } from 'fastify';
import type { ServerResponse } from 'node:http';

/**
 * Server-sent event streams on an admin listener (a worker's status stream, the frontend's fleet
 * stream). Every client gets every event; a client that does not keep up (SSE_MAX_BUFFERED bytes
 * unread) is dropped, since EventSource reconnects and starts again from a fresh snapshot. A comment
 * line every SSE_HEARTBEAT_MS keeps the stream inside the admin listener's idle-socket bound and lets
 * proxies see it alive. The streams end when the server closes, so they never hold a shutdown up.
 */

/** Under the admin listener's 60 s idle-connection bound. */
export const SSE_HEARTBEAT_MS = 15_000;
export const SSE_MAX_BUFFERED = 1024 * 1024;

/** One SSE frame; `data` is JSON. */
export function sseFrame(event: string, data: unknown): string {
  return `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;
}

export class SseHub {
  private readonly clients = new Set<ServerResponse>();
  private heartbeat: NodeJS.Timeout | undefined;

  /** `onEmpty`: the last client left (subscriptions kept for clients can be dropped). */
  constructor(
    app: FastifyInstance,
    private readonly onEmpty: () => void = () => undefined,
  ) {
    app.addHook('preClose', async () => this.closeAll());
  }

  get size(): number {
    return this.clients.size;
  }

  /** Takes the reply over as an event stream; `first` frames are written before any broadcast. */
  open(reply: FastifyReply, first: string[] = []): ServerResponse {
    reply.hijack();
    const res = reply.raw;
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', connection: 'keep-alive', 'x-accel-buffering': 'no' });
    // Browsers reconnect after `retry` ms when a stream ends (a restarted frontend).
    res.write(`retry: 1000\n\n${first.join('')}`);
    this.clients.add(res);
    res.once('close', () => this.drop(res));
    // A timer is right for the heartbeat: its point is the passing of time with nothing to say.
    this.heartbeat ??= setInterval(() => this.write(': keep-alive\n\n'), SSE_HEARTBEAT_MS).unref();
    return res;
  }

  send(event: string, data: unknown): void {
    if (this.clients.size > 0) this.write(sseFrame(event, data));
  }

  /** Writes to one client only (its snapshot, computed after it joined). */
  sendTo(res: ServerResponse, event: string, data: unknown): void {
    if (this.clients.has(res)) this.writeOne(res, sseFrame(event, data));
  }

  closeAll(): void {
    for (const res of [...this.clients]) {
      res.end();
      this.drop(res);
    }
  }

  private write(frame: string): void {
    for (const res of [...this.clients]) this.writeOne(res, frame);
  }

  private writeOne(res: ServerResponse, frame: string): void {
    if (res.writableLength > SSE_MAX_BUFFERED) {
      res.destroy();
      this.drop(res);
      return;
    }
    res.write(frame);
  }

  private drop(res: ServerResponse): void {
    if (!this.clients.delete(res)) return;
    if (this.clients.size === 0) {
      clearInterval(this.heartbeat);
      this.heartbeat = undefined;
      this.onEmpty();
    }
  }
}

/** An SSE frame's event name and JSON data; undefined for comments, retry lines and non-JSON data. */
export function parseSseFrame(frame: string): { event: string; data: unknown } | undefined {
  let event = 'message';
  const data: string[] = [];
  for (const line of frame.split('\n')) {
    if (line.startsWith('event:')) event = line.slice(6).trim();
    else if (line.startsWith('data:')) data.push(line.slice(5).trimStart());
  }
  if (data.length === 0) return undefined;
  try {
    return { event, data: JSON.parse(data.join('\n')) };
  } catch {
    return undefined;
  }
}

/** The events of an SSE response body, as they arrive; fails once one frame is past `maxFrameChars` (an endless line). */
export async function* readSse(body: AsyncIterable<Uint8Array | Buffer>, maxFrameChars = Infinity): AsyncGenerator<{ event: string; data: unknown }, void, void> {
  const decoder = new TextDecoder();
  let buffer = '';
  for await (const chunk of body) {
    buffer += decoder.decode(chunk, { stream: true });
    if (buffer.length > maxFrameChars && buffer.indexOf('\n\n') < 0) throw new Error(`event stream frame over ${maxFrameChars} characters`);
    let i: number;
    while ((i = buffer.indexOf('\n\n')) >= 0) {
      const parsed = parseSseFrame(buffer.slice(0, i));
      buffer = buffer.slice(i + 2);
      if (parsed !== undefined) yield parsed;
    }
  }
}
