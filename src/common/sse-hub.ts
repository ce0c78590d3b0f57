import type { FastifyInstance, FastifyReply } from 'fastify';
import type { ServerResponse } from 'node:http';
import { sseEvents } from './sse-events.js';
import { EbbError } from '../protocol/errors.js';

/**
 * Server-sent event streams on an admin listener (a worker's status stream, the frontend's fleet
 * stream). Every client gets every event; a client that does not keep up (SSE_MAX_BUFFERED bytes
 * unread) is dropped, since EventSource reconnects and starts again from a fresh snapshot. The
 * opening frames (a snapshot, which can be megabytes) are not counted: they are written once,
 * under the socket's own backpressure, so a reader that is slow to take them is not cut at the
 * first live event and reconnected into the same cut. A comment
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
  /** Each client, with the bytes of its opening frames still unsent when it opened (0 once they drained). */
  private readonly clients = new Map<ServerResponse, number>();
  private heartbeat: NodeJS.Timeout | undefined;

  /**
   * `onEmpty`: the last client left (subscriptions kept for clients can be dropped). `maxClients`
   * bounds the stream's clients; it is part of the listener's event-stream budget (see
   * connection-budget), so it never takes the room of the listener's other calls.
   */
  constructor(
    app: FastifyInstance,
    private readonly onEmpty: () => void = () => undefined,
    readonly maxClients = Infinity,
  ) {
    app.addHook('preClose', async () => this.closeAll());
  }

  get size(): number {
    return this.clients.size;
  }

  /** Refuses a client past `maxClients` (503 listener_busy, retryable); call before any work for it. */
  assertRoom(what: string): void {
    if (this.clients.size >= this.maxClients) throw new EbbError('listener_busy', `at most ${this.maxClients} ${what} at once; retry shortly`, { headers: { 'retry-after': '5' } });
  }

  /** Takes the reply over as an event stream; `first` frames are written before any broadcast. */
  open(reply: FastifyReply, first: string[] = []): ServerResponse {
    reply.hijack();
    const res = reply.raw;
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', connection: 'keep-alive', 'x-accel-buffering': 'no' });
    // Browsers reconnect after `retry` ms when a stream ends (a restarted frontend).
    const flushed = res.write(`retry: 1000\n\n${first.join('')}`);
    this.clients.set(res, flushed ? 0 : res.writableLength);
    if (!flushed) res.once('drain', () => this.clients.has(res) && this.clients.set(res, 0));
    res.once('close', () => this.drop(res));
    // A timer is right for the heartbeat: its point is the passing of time with nothing to say.
    this.heartbeat ??= setInterval(() => this.write(': keep-alive\n\n'), SSE_HEARTBEAT_MS).unref();
    return res;
  }

  send(event: string, data: unknown): void {
    if (this.clients.size > 0) this.write(sseFrame(event, data));
  }

  closeAll(): void {
    for (const res of [...this.clients.keys()]) {
      res.end();
      this.drop(res);
    }
  }

  private write(frame: string): void {
    for (const [res, opening] of [...this.clients]) this.writeOne(res, opening, frame);
  }

  /** `opening`: unsent bytes of the opening frames, ahead of every live one in the buffer. */
  private writeOne(res: ServerResponse, opening: number, frame: string): void {
    if (res.writableLength - opening > SSE_MAX_BUFFERED) {
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

/**
 * The events of one of ebb's own SSE streams (JSON data), as they arrive; non-JSON data is skipped.
 * Fails once one event is past `maxEventChars` (an endless line from a peer).
 */
export async function* readSse(body: AsyncIterable<Uint8Array | Buffer>, maxEventChars = Infinity): AsyncGenerator<{ event: string; data: unknown }, void, void> {
  for await (const { event, data } of sseEvents(body, maxEventChars)) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(data);
    } catch {
      continue;
    }
    yield { event, data: parsed };
  }
}
