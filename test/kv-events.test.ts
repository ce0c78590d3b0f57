import { describe, it, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { call } from './helpers/http.js';
import { openEventStream } from './helpers/event-stream.js';
import { startWorker, tempDiscoveryUrl, type WorkerHandle } from './helpers/processes.js';
import { KvEventLog, type EngineKvBatch } from '../src/engine/kv-event-log.js';
import { isWorkerRecord } from '../src/discovery/worker-record.js';
import { blockHashes } from '../src/protocol/block-hash.js';
import { mockerTokenIds } from '../src/protocol/mocker-tokenizer.js';
import { metricValue } from './helpers/processes.js';
import { words } from './helpers/words.js';

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


async function generate(w: WorkerHandle, body: Record<string, unknown>): Promise<{ text: string; usage: any }> {
  const res = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', stream: false, ...body });
  assert.equal(res.status, 200, JSON.stringify(res.body));
  return res.body;
}

/** Every hash stored in the batches after `seq`, once `want` are all among them. */
async function waitStored(s: Awaited<ReturnType<typeof openEventStream>>, want: number[], seq: number): Promise<Set<number>> {
  const stored = () => new Set<number>(s.events.filter((e) => e.event === 'kv' && e.data.seq > seq).flatMap((e) => e.data.events.flatMap((x: { type: string; block_hashes?: number[] }) => (x.type === 'stored' ? x.block_hashes ?? [] : []))));
  await s.waitFor(() => want.every((h) => stored().has(h)), 'the prompt blocks stored');
  return stored();
}

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

  it('caches a prompt: a repeat finds its whole blocks cached, the stream carries the stored blocks, status and metrics count it', async () => {
    const s = await openEventStream(`${w.systemUrl}/kv/events`);
    try {
      const snap = await s.waitFor((e) => e.event === 'snapshot', 'the snapshot');
      const prompt = words(200, 'doc');
      const first = await generate(w, { prompt, max_tokens: 8 });
      assert.equal(first.usage.prompt_tokens, 200);
      assert.deepEqual(first.usage.prompt_tokens_details, { cached_tokens: 0 });
      const again = await generate(w, { prompt, max_tokens: 8 });
      // 12 whole blocks (192 tokens); the last token is always computed, as in vLLM.
      assert.deepEqual(again.usage.prompt_tokens_details, { cached_tokens: 192 });

      const want = blockHashes(mockerTokenIds(prompt));
      const stored = await waitStored(s, want, snap.data.seq);
      assert.ok(want.every((h) => stored.has(h)), 'every whole block of the prompt was published as stored');
      const batches = s.events.filter((e) => e.event === 'kv');
      batches.forEach((b, i) => assert.equal(b.data.seq, snap.data.seq + 1 + i, 'batches are numbered consecutively from the snapshot'));
      assert.ok(batches.every((b) => b.data.worker_id === w.workerId && b.data.incarnation === snap.data.incarnation));

      const status = await call('GET', `${w.systemUrl}/engine/status`);
      assert.equal(status.body.kv_cache.block_size, 16);
      assert.equal(status.body.kv_cache.capacity_blocks, 8192);
      assert.ok(status.body.kv_cache.cached_blocks >= want.length, `cached_blocks ${status.body.kv_cache.cached_blocks}`);
      assert.equal(status.body.kv_cache.prompt_tokens_hit, 192);
      assert.equal(await metricValue(w.systemUrl, 'ebb_worker_prompt_tokens_total', 'cache="hit"'), 192);
      assert.equal(await metricValue(w.systemUrl, 'ebb_worker_prompt_tokens_total', 'cache="miss"'), 208);
      assert.equal(await metricValue(w.systemUrl, 'ebb_worker_kv_cached_blocks'), status.body.kv_cache.cached_blocks);

      // A new subscriber's snapshot holds what the batches said.
      const late = await openEventStream(`${w.systemUrl}/kv/events`);
      const lateSnap = await late.waitFor((e) => e.event === 'snapshot', 'a later snapshot');
      late.close();
      assert.ok(want.every((h) => lateSnap.data.blocks.includes(h)));
      assert.equal(lateSnap.data.incarnation, snap.data.incarnation);
    } finally {
      s.close();
    }
  });

  it("caches a chat turn's answer: the next turn finds the previous prompt and answer cached", async () => {
    const doc = words(100, 'chat');
    const turn1 = [{ role: 'user', content: doc }];
    const one = await generate(w, { messages: turn1, max_tokens: 40 });
    const turn2 = [...turn1, { role: 'assistant', content: one.text }, { role: 'user', content: 'and then?' }];
    const two = await generate(w, { messages: turn2, max_tokens: 4 });
    // The first turn's sequence: its prompt, the answer's turn ("assistant:"), the answer.
    const held = mockerTokenIds(`user: ${doc}`).length + 1 + mockerTokenIds(one.text).length;
    assert.equal(two.usage.prompt_tokens_details.cached_tokens, Math.floor(held / 16) * 16);
    assert.ok(two.usage.prompt_tokens_details.cached_tokens > Math.floor(mockerTokenIds(`user: ${doc}`).length / 16) * 16, 'the answer was cached, not only the prompt');
  });

  it('evicts the least recently used blocks no sequence holds, and publishes their removal', async () => {
    const small = await worker(['--mocker-kv-blocks', '20']);
    const s = await openEventStream(`${small.systemUrl}/kv/events`);
    try {
      const snap = await s.waitFor((e) => e.event === 'snapshot', 'the snapshot');
      const a = words(200, 'first'); // 12 whole blocks: two of them do not fit in 20
      await generate(small, { prompt: a, max_tokens: 1 });
      await generate(small, { prompt: words(200, 'second'), max_tokens: 1 });
      const removed = await s.waitFor((e) => e.event === 'kv' && e.data.events.some((x: { type: string }) => x.type === 'removed'), 'a removed event', 1);
      assert.ok(removed.data.seq > snap.data.seq);
      const status = await call('GET', `${small.systemUrl}/engine/status`);
      assert.ok(status.body.kv_cache.cached_blocks <= 20, `capacity kept: ${status.body.kv_cache.cached_blocks}`);
      // The second prompt needed 4 blocks: the first prompt's last 4 went (a sequence's tail before its head).
      const again = await generate(small, { prompt: a, max_tokens: 1 });
      assert.equal(again.usage.prompt_tokens_details.cached_tokens, 8 * 16);
    } finally {
      s.close();
    }
  });

  it('a prefill worker pays only for the uncached part of a prompt, from the same cache', async () => {
    const pw = await worker(['--mode', 'prefill']);
    const prompt = words(200, 'pre');
    for (let i = 0; i < 2; i++) {
      const t = await call('POST', `${pw.requestUrl}/prefill`, { model: 'm1', prompt });
      assert.equal(t.status, 200, JSON.stringify(t.body));
      assert.equal((await call('DELETE', `${pw.requestUrl}/kv/${t.body.transfer_id}`)).status, 204);
    }
    const status = await call('GET', `${pw.systemUrl}/engine/status`);
    assert.equal(status.body.kv_cache.prompt_tokens_hit, 192, 'the second prefill found the first one\'s blocks');
    assert.equal(status.body.kv_cache.prompt_tokens_missed, 208);
  });

  it('is absent on a worker whose cache is off, which declares none', async () => {
    const off = await worker(['--mocker-kv-cache', 'off']);
    const res = await call('GET', `${off.systemUrl}/kv/events`);
    assert.equal(res.status, 404);
    assert.equal(res.body.error.code, 'not_found');
    const record = recordOf(off);
    assert.equal(record.kv_cache, undefined);
    const status = await call('GET', `${off.systemUrl}/engine/status`);
    assert.equal(status.body.kv_cache, undefined);
    const r = await generate(off, { prompt: words(50, 'x'), max_tokens: 2 });
    assert.equal(r.usage.prompt_tokens_details, undefined, 'an engine without a cache reports nothing cached, not 0');
  });
});

describe('the kv_cache declaration in a discovery record', () => {
  it('is checked like every other field of a record another process wrote', () => {
    const base = { worker_id: 'w-1', model: 'm1', mode: 'aggregated', request_url: 'http://127.0.0.1:1', system_url: 'http://127.0.0.1:2' };
    assert.ok(isWorkerRecord({ ...base, kv_cache: { block_size: 16, tokenizer: 'worker', events: 'none' } }));
    assert.ok(isWorkerRecord(base), 'a record without one (an older worker, an engine without a cache)');
    for (const bad of [{ block_size: 0, tokenizer: 'worker', events: 'exact' }, { block_size: 16, tokenizer: 'bpe', events: 'exact' }, { block_size: 16, tokenizer: 'worker', events: 'some' }, 'yes'])
      assert.equal(isWorkerRecord({ ...base, kv_cache: bad }), false, JSON.stringify(bad));
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
