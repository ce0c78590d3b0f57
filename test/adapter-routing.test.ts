import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import pino from 'pino';
import { adapterRoot, blockHashes } from '../src/protocol/block-hash.js';
import { mockerTokenIds } from '../src/protocol/mocker-tokenizer.js';
import { KvFeed } from '../src/frontend/routing/kv-feed.js';
import { Router } from '../src/frontend/routing/router.js';
import { WorkerPool } from '../src/frontend/routing/worker-pool.js';
import { isWorkerRecord, type WorkerRecord } from '../src/discovery/discovery.js';
import type { AdapterRecord } from '../src/protocol/adapters.js';

const log = pino({ level: 'silent' });

const rec = (id: string, adapters: Partial<AdapterRecord> = {}): WorkerRecord => ({
  worker_id: `w-${id}`,
  model: 'm',
  mode: 'aggregated',
  request_url: `http://${id}`,
  system_url: `http://${id}-sys`,
  kv_cache: { block_size: 16, tokenizer: 'mocker-words', events: 'none' },
  adapters: { slots: 2, load_ms: 500, available: ['a1', 'a2'], resident: {}, ...adapters },
});

function fleet(records: WorkerRecord[], kind: 'kv' | 'least-loaded' = 'kv') {
  const pool = new WorkerPool();
  const feed = new KvFeed(log);
  const event = { type: 'reset' as const, records };
  pool.apply(event);
  feed.apply(event);
  const router = new Router(pool, { kind, feed });
  /** Routes one request as Upstream does; `sent`: admitted too (the router remembers its blocks on that worker). */
  const route = async (adapter: string | undefined, prompt = 'quiet steady light', sent = false) => {
    const body = { model: 'm', prompt, ...(adapter === undefined ? {} : { adapter }) };
    const hint = await router.prepare(body, 'aggregated', new Set(), []);
    const w = router.pick('m', 'aggregated', new Set(), [], hint, adapter);
    if (sent && w) router.routed(w, hint);
    return { id: w?.record.worker_id, cached: hint?.chosen?.cachedTokens ?? 0 };
  };
  const pick = async (adapter: string | undefined, prompt?: string) => (await route(adapter, prompt)).id;
  return { pool, pick, route };
}

describe('adapter routing', () => {
  it("salts an adapter's block hashes: adapters never share a block, the base model's hashes are unchanged", () => {
    const tokens = mockerTokenIds(Array.from({ length: 48 }, (_, i) => `w${i}`).join(' '));
    const base = blockHashes(tokens, 16);
    assert.deepEqual(blockHashes(tokens, 16, adapterRoot(undefined)), base);
    const a1 = blockHashes(tokens, 16, adapterRoot('a1'));
    const a2 = blockHashes(tokens, 16, adapterRoot('a2'));
    for (const h of a1) assert.ok(!base.includes(h) && !a2.includes(h));
  });

  it('the router salts what it remembers of a worker by adapter: the same prompt under another adapter finds nothing cached', async () => {
    const { route } = fleet([rec('a', { resident: { a1: 'serving', a2: 'serving' } }), rec('b', { resident: { a1: 'serving', a2: 'serving' } })]);
    const prompt = Array.from({ length: 40 }, (_, i) => `w${i}`).join(' ');
    const first = await route('a1', prompt, true);
    const again = await route('a1', prompt);
    assert.equal(again.id, first.id);
    assert.equal(again.cached, 32, 'two whole blocks remembered under a1');
    assert.equal((await route('a2', prompt)).cached, 0, 'not under a2');
    assert.equal((await route(undefined, prompt)).cached, 0, 'nor for the base model');
  });

  it('prefers the worker where the adapter is resident, loads it where a slot is free, and spreads it once the resident worker is busier than a load costs', async () => {
    const { pool, pick } = fleet([rec('a', { resident: { a1: 'serving' } }), rec('b'), rec('c', { resident: { a2: 'serving' } })]);
    const a = pool.get('w-a')!;
    const c = pool.get('w-c')!;
    assert.equal(await pick('a1'), 'w-a', 'resident, idle: no load anywhere');
    assert.equal(await pick('a2'), 'w-c', 'a2 is resident on c only');
    c.inflight = 3; // 3 x 64 tokens of load: less than a 500 ms load elsewhere (500 tokens)
    assert.equal(await pick('a2'), 'w-c');
    c.inflight = 9;
    assert.equal(await pick('a2'), 'w-b', 'past the load cost: a2 spreads to the worker with a free slot');
    a.inflight = 20;
    c.inflight = 20;
    assert.equal(await pick('a1'), 'w-b', 'a hot a1 spreads too');
  });

  it('a worker draining the adapter, or unable to load it, is not eligible, whatever the router', async () => {
    for (const kind of ['kv', 'least-loaded'] as const) {
      const { pick } = fleet([rec('a', { available: ['a1'], resident: { a1: 'draining' } }), rec('b', { available: ['a2'] })], kind);
      assert.equal(await pick('a1'), undefined, `${kind}: nobody can take a1`);
      assert.equal(await pick('a2'), 'w-b', `${kind}: a2 only on b`);
    }
  });

  it('discovery records: adapters checked field by field', () => {
    assert.ok(isWorkerRecord(rec('a', { resident: { a1: 'loading' } })));
    assert.ok(!isWorkerRecord(rec('a', { resident: { a1: 'bogus' as never } })), 'an unknown state');
    assert.ok(!isWorkerRecord(rec('a', { slots: -1 })), 'negative slots');
    assert.ok(!isWorkerRecord(rec('a', { available: ['../etc'] })), 'not an adapter name');
    assert.ok(!isWorkerRecord({ ...rec('a'), adapters: { slots: 1, load_ms: 1, available: [] } }), 'no resident map');
  });
});
