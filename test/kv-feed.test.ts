import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { Writable } from 'node:stream';
import type { ServerResponse } from 'node:http';
import pino from 'pino';
import { KvFeed } from '../src/frontend/routing/kv-feed.js';
import type { WorkerRecord } from '../src/discovery/discovery.js';
import { fakeWorker, type FakeWorker } from './helpers/http.js';
import { bounded } from './helpers/processes.js';

/**
 * The KV event subscriptions against a fake worker's /kv/events: what the frontend indexes, and
 * when it drops it (identity, seq gap, new incarnation, a departed worker whose stream fails).
 * In process: a real socket, no worker process.
 */
const logs = new EventEmitter();
const log = pino(
  { level: 'debug' },
  new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const line of chunk.toString().split('\n')) if (line) logs.emit('line', JSON.parse(line));
      done();
    },
  }),
);
/** The next log line of `event` matching `pred`; bounded, so a missing one fails naming what was awaited. */
const logged = (event: string, pred: (l: Record<string, unknown>) => boolean = () => true, what = '') => {
  let on!: (l: Record<string, unknown>) => void;
  const seen = new Promise<Record<string, unknown>>((resolve) => {
    on = (l) => {
      if (l.event !== event || !pred(l)) return;
      logs.off('line', on);
      resolve(l);
    };
    logs.on('line', on);
  });
  seen.catch(() => undefined);
  return bounded(seen, `the frontend's log line ${event}${what ? ` (${what})` : ''}`).finally(() => logs.off('line', on));
};

const frame = (event: string, data: unknown) => `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;
const rec = (id: string, systemUrl: string): WorkerRecord => ({
  worker_id: id,
  model: 'm',
  mode: 'aggregated',
  request_url: 'http://127.0.0.1:1',
  system_url: systemUrl,
  kv_cache: { block_size: 16, tokenizer: 'mocker-words', events: 'exact' },
});

const closers: Array<() => Promise<void>> = [];
after(async () => {
  for (const c of closers) await c();
});

/** A fake worker whose n-th /kv/events connection is answered by script[n] (the last one repeats). */
async function fake(script: Array<(res: ServerResponse) => void>): Promise<FakeWorker> {
  let n = 0;
  const f = await fakeWorker((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    script[Math.min(n++, script.length - 1)]!(res);
  });
  closers.push(() => f.close());
  return f;
}

describe('KV event subscriptions', () => {
  it('indexes the snapshot and batches; a seq gap drops everything and a fresh snapshot (new incarnation) replaces it', async () => {
    // The gap is sent once the first batch's index has been checked (one read could carry both).
    let sendGap!: () => void;
    const checked = new Promise<void>((resolve) => (sendGap = resolve));
    const w = await fake([
      (res) => {
        res.write(frame('snapshot', { worker_id: 'w1', incarnation: 'i1', seq: 5, block_size: 16, blocks: [1, 2, 3] }));
        res.write(frame('kv', { worker_id: 'w1', incarnation: 'i1', seq: 6, ts: 0, events: [{ type: 'stored', block_hashes: [4], parent_block_hash: 3 }, { type: 'removed', block_hashes: [1] }] }));
        void checked.then(() => res.write(frame('kv', { worker_id: 'w1', incarnation: 'i1', seq: 8, ts: 0, events: [{ type: 'stored', block_hashes: [5], parent_block_hash: 4 }] })));
      },
      (res) => res.write(frame('snapshot', { worker_id: 'w1', incarnation: 'i2', seq: 0, block_size: 16, blocks: [9] })),
    ]);
    const feed = new KvFeed(log);
    closers.push(() => feed.close());
    const batch = logged('kv_indexed', (l) => l.worker_id === 'w1' && l.seq === 6, 'w1 seq 6');
    const gap = logged('kv_stream_failed', (l) => l.worker_id === 'w1', 'w1 after the seq gap');
    const second = logged('kv_stream_connected', (l) => l.worker_id === 'w1' && l.seq === 0, "w1's second incarnation");
    feed.apply({ type: 'put', record: rec('w1', w.url) });
    await batch;
    assert.deepEqual([...feed.index.holder('w1')!.blocks.keys()].sort(), [2, 3, 4]);
    sendGap();
    assert.match(String((await gap).reason), /seq gap \(6 then 8\)/);
    await second;
    const h = feed.index.holder('w1')!;
    assert.equal(h.incarnation, 'i2');
    assert.deepEqual([...h.blocks.keys()], [9], "the old incarnation's blocks are gone");
    assert.equal(feed.index.blocksOf('m'), 1);
  });

  it('a batch from a new incarnation on the same stream drops the old one\'s blocks and indexes nothing of it', async () => {
    const w = await fake([
      (res) => {
        res.write(frame('snapshot', { worker_id: 'w4', incarnation: 'i1', seq: 5, block_size: 16, blocks: [21, 22] }));
        // The engine restarted behind the same stream: seq goes on, the incarnation does not.
        res.write(frame('kv', { worker_id: 'w4', incarnation: 'i2', seq: 6, ts: 0, events: [{ type: 'stored', block_hashes: [23], parent_block_hash: 22 }] }));
      },
      (res) => res.write(frame('snapshot', { worker_id: 'w4', incarnation: 'i2', seq: 6, block_size: 16, blocks: [29] })),
    ]);
    const feed = new KvFeed(log);
    closers.push(() => feed.close());
    const first = Promise.race([
      logged('kv_stream_failed', (l) => l.worker_id === 'w4').then((l) => ({ failed: String(l.reason) })),
      logged('kv_indexed', (l) => l.worker_id === 'w4' && l.seq === 6).then(() => ({ failed: undefined })),
    ]);
    const again = logged('kv_stream_connected', (l) => l.worker_id === 'w4' && l.seq === 6);
    feed.apply({ type: 'put', record: rec('w4', w.url) });
    assert.match((await first).failed ?? 'the batch of incarnation i2 was indexed under i1', /new incarnation/);
    await again;
    const h = feed.index.holder('w4')!;
    assert.equal(h.incarnation, 'i2');
    assert.deepEqual([...h.blocks.keys()], [29], 'only the new snapshot is held');
  });

  it('indexes nothing from a stream that answers as another worker', async () => {
    const w = await fake([(res) => res.write(frame('snapshot', { worker_id: 'intruder', incarnation: 'x', seq: 0, block_size: 16, blocks: [7, 8] }))]);
    const feed = new KvFeed(log);
    closers.push(() => feed.close());
    const refused = logged('kv_stream_failed', (l) => l.worker_id === 'w2', 'w2 answered as another worker');
    feed.apply({ type: 'put', record: rec('w2', w.url) });
    assert.match(String((await refused).reason), /answers as worker "intruder", not w2/);
    assert.equal(feed.index.holder('w2'), undefined);
    assert.equal(feed.index.blocksOf('m'), 0);
  });

  it('keeps a departed worker masked while its stream lives, and forgets it once the stream fails', async () => {
    let live: ServerResponse | undefined;
    const w = await fake([
      (res) => {
        live = res;
        res.write(frame('snapshot', { worker_id: 'w3', incarnation: 'i', seq: 0, block_size: 16, blocks: [11, 12] }));
      },
    ]);
    const feed = new KvFeed(log);
    closers.push(() => feed.close());
    const connected = logged('kv_stream_connected', (l) => l.worker_id === 'w3', 'w3');
    feed.apply({ type: 'put', record: rec('w3', w.url) });
    await connected;
    feed.apply({ type: 'delete', worker_id: 'w3' });
    assert.deepEqual(feed.describe('w3'), { mode: 'exact', cached_blocks: 2, masked: true, stream: 'connected' });
    const purged = logged('kv_index_purged', (l) => l.worker_id === 'w3', 'w3 after its stream failed');
    await w.close(); // the worker stopped
    live?.destroy();
    await purged;
    assert.equal(feed.describe('w3'), null);
    assert.equal(feed.index.blocksOf('m'), 0, 'nothing left of a worker that is gone');
  });
});
