import { EventEmitter } from 'node:events';
import { bounded } from './processes.js';
import { readSse } from '../../src/common/sse-hub.js';

export interface SseEvent {
  event: string;
  data: any;
}

/** A server-sent event stream read in the background: every event kept, waits resolve on arrival. */
export interface EventStream {
  readonly events: SseEvent[];
  /** The first event (at index >= `after`) matching `pred`, past or future; bounded. */
  waitFor(pred: (e: SseEvent) => boolean, what: string, after?: number): Promise<SseEvent>;
  close(): void;
}

export async function openEventStream(url: string, headers: Record<string, string> = {}): Promise<EventStream> {
  const controller = new AbortController();
  const res = await fetch(url, { headers: { accept: 'text/event-stream', ...headers }, signal: controller.signal });
  if (res.status !== 200 || !res.body) throw new Error(`${url}: HTTP ${res.status}: ${await res.text()}`);
  const events: SseEvent[] = [];
  const arrived = new EventEmitter();
  arrived.setMaxListeners(0); // one pair per pending wait
  void (async () => {
    try {
      for await (const e of readSse(res.body as AsyncIterable<Uint8Array>)) {
        events.push(e);
        arrived.emit('event');
      }
    } catch {
      /* aborted */
    }
    arrived.emit('end');
  })();
  return {
    events,
    waitFor(pred, what, after = 0) {
      const find = () => events.slice(after).find(pred);
      const hit = find();
      if (hit) return Promise.resolve(hit);
      let cleanup = () => undefined as void;
      return bounded(
        new Promise<SseEvent>((resolve, reject) => {
          const onEvent = () => {
            const e = find();
            if (e) {
              cleanup();
              resolve(e);
            }
          };
          const onEnd = () => {
            cleanup();
            reject(new Error(`stream ${url} ended before ${what}`));
          };
          cleanup = () => {
            arrived.off('event', onEvent);
            arrived.off('end', onEnd);
          };
          arrived.on('event', onEvent);
          arrived.on('end', onEnd);
        }),
        `${url}: waiting for ${what}; got ${events.map((e) => e.event).join(', ')}`,
      ).finally(() => cleanup());
    },
    close: () => controller.abort(),
  };
}
