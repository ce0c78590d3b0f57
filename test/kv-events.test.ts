import { describe, it, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { call } from './helpers/http.js';
import { openEventStream } from './helpers/event-stream.js';
import { startWorker, tempDiscoveryUrl, type WorkerHandle } from './helpers/processes.js';
import { KvEventLog, type EngineKvBatch } from '../src/engine/kv-event-log.js';

const started: WorkerHandle[] = [];
after(async () => {
  await Promise.all(started.map((w) => w.stop()));
});

async function worker(args: string[] = []): Promise<WorkerHandle & { discoveryDir: string }> {
  const url = tempDiscoveryUrl();
  const w = await startWorker(['--discovery', url, '--model', 'm1', '--mocker-itl-ms', '0', '--mocker-ttft-ms', '0', '--mocker-max-context', '4096', ...args]);
  started.push(w);
  return Object.assign(w, { discoveryDir: fileURLToPath(url) });
}

const recordOf = (w: WorkerHandle & { discoveryDir: string }) => JSON.parse(readFileSync(join(w.discoveryDir, `${w.workerId}.json`), 'utf8')).record;

describe('KV events: GET /kv/events on the worker system server', () => {
  let w: WorkerHandle & { discoveryDir: string };
  before(async () => {
    w = await worker();
  });

  it('declares the prefix cache in the discovery record', () => {
    const record = recordOf(w);
    assert.deepEqual(record.kv_cache, { block_size: 16, tokenizer: 'mocker-words', events: 'exact' });
  });

  it('opens with a snapshot of an empty cache, with an incarnation and seq', async () => {
    const s = await openEventStream(`${w.systemUrl}/kv/events`);
    try {
      const snap = await s.waitFor((e) => e.event === 'snapshot', 'the snapshot');
      assert.equal(snap.data.worker_id, w.workerId);
      assert.equal(snap.data.block_size, 16);
      assert.match(snap.data.incarnation, /^[0-9a-f]{16}$/);
      assert.equal(typeof snap.data.seq, 'number');
      assert.ok(Array.isArray(snap.data.blocks));
    } finally {
      s.close();
    }
  });

  it('is absent on a worker whose cache is off, which declares none', async () => {
    const off = await worker(['--mocker-kv-cache', 'off']);
    const res = await call('GET', `${off.systemUrl}/kv/events`);
    assert.equal(res.status, 404);
    assert.equal(res.body.error.code, 'not_found');
    const record = recordOf(off);
    assert.equal(record.kv_cache, undefined);
  });
});

describe('KvEventLog: the engine side of the stream', () => {
  it('numbers one batch per event-loop turn, coalesces chained stores, and snapshots what is held', async () => {
    const log = new KvEventLog(16, 'mocker-words');
    const batches: EngineKvBatch[] = [];
    const before = log.snapshot();
    log.onBatch((b) => batches.push(b));
    log.stored([1, 2], 0);
    log.stored([3], 2); // continues the chain: one event
    log.stored([1, 2, 4], 0); // 1 and 2 are held: only 4 is news, after 2
    log.removed([3, 99]); // 99 was never held
    await new Promise((r) => setImmediate(r));
    assert.equal(batches.length, 1);
    assert.equal(batches[0]?.seq, before.seq + 1);
    assert.deepEqual(batches[0]?.events, [
      { type: 'stored', block_hashes: [1, 2, 3], parent_block_hash: 0 },
      { type: 'stored', block_hashes: [4], parent_block_hash: 2 },
      { type: 'removed', block_hashes: [3] },
    ]);
    log.stored([5], 4);
    const snap = log.snapshot(); // flushes the pending store first, so the snapshot's seq covers it
    assert.equal(batches.length, 2);
    assert.equal(snap.seq, batches[1]?.seq);
    assert.deepEqual(snap.blocks.sort(), [1, 2, 4, 5]);
    log.cleared();
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(batches[2]?.events, [{ type: 'cleared' }]);
    assert.equal(log.size, 0);
  });
});
