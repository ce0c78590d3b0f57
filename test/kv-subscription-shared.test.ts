import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { fakeWorker, injectRecord, type FakeWorker } from './helpers/http.js';
import { startFrontend, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type LogLine } from './helpers/processes.js';
import { call } from './helpers/http.js';

/**
 * One KV subscription per frontend host: the children of `ebb frontend --processes 3` follow the
 * primary's one GET /kv/events per worker instead of each opening their own (16 frontends x 4
 * processes held 64 streams on every worker, its whole subscriber cap). A real frontend and a
 * fake worker's system port that serves /kv/events and counts the streams it holds.
 */
const PROCESSES = 3;
const started: EbbProcess[] = [];
let worker: FakeWorker;
let frontend: FrontendHandle;
/** The open /kv/events responses, in arrival order. */
const streams: ServerResponse[] = [];
let requests = 0;
let incarnation = 'i1';

const frame = (event: string, data: unknown) => `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;
const child = (l: LogLine) => typeof l.frontend_process === 'number';

before(async () => {
  worker = await fakeWorker((req, res) => {
    if (req.url !== '/kv/events') return void res.writeHead(404).end();
    requests++;
    streams.push(res);
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(frame('snapshot', { worker_id: 'w-kv', incarnation, seq: 10, block_size: 16, blocks: [1, 2, 3] }));
  });
  const discovery = tempDiscoveryUrl();
  injectRecord(discovery, {
    worker_id: 'w-kv',
    model: 'm1',
    request_url: 'http://127.0.0.1:1',
    system_url: worker.url,
    kv_cache: { block_size: 16, tokenizer: 'mocker-words', events: 'exact' },
  });
  frontend = await startFrontend(discovery, ['--router', 'kv', '--processes', String(PROCESSES), '--admin-port', '0'], { EBB_LOG_LEVEL: 'debug' });
  started.push(frontend);
});

after(async () => {
  await Promise.all(started.map((p) => p.stop()));
  await worker.close();
});

/** Resolves once every child logged an event matching `pred` at or after log line `after`. */
async function everyChild(event: string, pred: (l: LogLine) => boolean, after = 0): Promise<void> {
  const seen = new Set<number>();
  let from = after;
  while (seen.size < PROCESSES) {
    const l = await frontend.waitForEvent(event, (x) => child(x) && pred(x) && !seen.has(x.frontend_process as number), { after: from });
    seen.add(l.frontend_process as number);
    from = frontend.logs.indexOf(l) + 1;
  }
}

describe('a frontend of several processes', () => {
  it('holds one KV event stream per worker, which every child routes by', async () => {
    await everyChild('kv_stream_connected', (l) => l.worker_id === 'w-kv' && l.cached_blocks === 3);
    assert.equal(requests, 1, `the worker was asked for ${requests} KV event streams`);
    // A batch the worker sends reaches every child, in order after the snapshot.
    const mark = frontend.mark();
    streams[0]!.write(frame('kv', { worker_id: 'w-kv', incarnation, seq: 11, ts: 0, events: [{ type: 'stored', block_hashes: [4, 5], parent_block_hash: 3 }] }));
    await everyChild('kv_indexed', (l) => l.worker_id === 'w-kv' && l.seq === 11 && l.cached_blocks === 5, mark);
    // The primary's admin listener shows the router's view too (it holds the stream).
    const admin = (await frontend.waitForEvent('admin_ready')).url as string;
    const w = await call('GET', `${admin}/workers/w-kv`);
    assert.equal(w.body.kv?.mode, 'exact', JSON.stringify(w.body.kv));
    assert.equal(w.body.kv?.cached_blocks, 5);
  });

  it('passes a broken stream on to every child, which follow the primary\'s new one', async () => {
    const mark = frontend.mark();
    incarnation = 'i2';
    streams[0]!.end();
    await everyChild('kv_stream_failed', (l) => l.worker_id === 'w-kv', mark);
    await everyChild('kv_stream_connected', (l) => l.worker_id === 'w-kv' && l.cached_blocks === 3, mark);
    assert.equal(requests, 2, `after one break the worker was asked for ${requests} KV event streams in all`);
  });
});
