import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { request } from 'undici';
import { createHttpServer, listen } from '../src/common/http-server.js';
import { readSse, SseHub, sseFrame, SSE_MAX_BUFFERED } from '../src/common/sse-hub.js';
import { bounded } from './helpers/processes.js';

/**
 * A stream's opening snapshot larger than the hub's live buffer (a worker's whole prefix cache on
 * /kv/events), written to a reader that is not reading yet. Live events then arrived with the
 * snapshot still buffered, the hub took the reader for one that fell behind and cut the stream, and
 * the reader reconnected into the same cut. A real listener on port 0 and a real socket whose reader
 * holds off until the live events were sent.
 */
const app = createHttpServer({ role: 'admin' });
const hub = new SseHub(app);
let opened: (res: ServerResponse) => void;
const streamOpened = new Promise<ServerResponse>((resolve) => (opened = resolve));
const BLOCKS = Array.from({ length: 1_500_000 }, (_, i) => i * 7919);
app.get('/events', async (_req, reply) => {
  opened(hub.open(reply, [sseFrame('snapshot', { blocks: BLOCKS })]));
});

after(() => app.close());

describe('an SSE hub with a snapshot larger than its live buffer', () => {
  it('delivers the whole snapshot and the live events after it to a reader that starts late', async () => {
    const url = await listen(app, '127.0.0.1', 0);
    // Headers only: the body is not read until the live events were sent.
    const res = await request(`${url}/events`);
    assert.equal(res.statusCode, 200);
    const server = await bounded(streamOpened, 'the hub to open the stream');
    assert.ok(server.writableLength > SSE_MAX_BUFFERED, `precondition: the unread snapshot fills more than the live buffer (${server.writableLength} bytes pending)`);
    for (let seq = 1; seq <= 3; seq++) hub.send('kv', { seq });
    assert.equal(hub.size, 1, 'the reader is still subscribed after live events arrived behind its snapshot');

    const events: Array<{ event: string; data: unknown }> = [];
    await bounded(
      (async () => {
        for await (const e of readSse(res.body, 64 * 1024 * 1024)) {
          events.push(e);
          if (e.event === 'kv' && (e.data as { seq: number }).seq === 3) break;
        }
      })(),
      'the snapshot and three live events',
      60_000,
    );
    assert.deepEqual(
      events.map((e) => e.event),
      ['snapshot', 'kv', 'kv', 'kv'],
    );
    assert.equal((events[0]?.data as { blocks: number[] }).blocks.length, BLOCKS.length, 'the snapshot arrived whole');
    assert.deepEqual(
      events.slice(1).map((e) => (e.data as { seq: number }).seq),
      [1, 2, 3],
    );
  });

  it('still drops a reader that falls behind on live events', async () => {
    const url = (app.server.address() as { port: number }).port;
    const res = await request(`http://127.0.0.1:${url}/events`);
    assert.equal(res.statusCode, 200);
    // Live frames far past the bound with nothing read: the hub must give up on this reader.
    const frame = 'x'.repeat(64 * 1024);
    const dropped = new Promise<void>((resolve) => res.body.once('error', () => resolve()).once('end', () => resolve()));
    for (let i = 0; hub.size > 0 && i < 10_000; i++) hub.send('kv', { frame });
    assert.equal(hub.size, 0, 'the reader that never read was dropped');
    res.body.resume();
    await bounded(dropped, 'the dropped stream to end at the reader');
  });
});
