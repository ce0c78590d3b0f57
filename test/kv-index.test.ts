import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import pino from 'pino';
import { blockHashes } from '../src/protocol/block-hash.js';
import { mockerTokenIds } from '../src/protocol/mocker-tokenizer.js';
import { KvIndex, RECENT_HALF_LIFE_MS } from '../src/frontend/routing/kv-index.js';
import { KvFeed } from '../src/frontend/routing/kv-feed.js';
import { evictionCost, Router } from '../src/frontend/routing/router.js';
import { WorkerPool } from '../src/frontend/routing/worker-pool.js';
import type { WorkerRecord } from '../src/discovery/discovery.js';
import type { GenerateBody } from '../src/protocol/request-plane.js';

const log = pino({ level: 'silent' });

/** Records that declare a mocker-words cache with no events: the router approximates from what it sent. */
const rec = (id: string, kv: 'mocker' | 'none' = 'mocker'): WorkerRecord =>
  ({
    worker_id: id,
    model: 'm',
    mode: 'aggregated',
    request_url: `http://${id}`,
    system_url: `http://${id}-sys`,
    ...(kv === 'mocker' ? { kv_cache: { block_size: 16, tokenizer: 'mocker-words', events: 'none' } } : {}),
  }) as WorkerRecord;

const words = (tag: string, n: number) => Array.from({ length: n }, (_, i) => `${tag}${i}`).join(' ');
const body = (prompt: string): GenerateBody => ({ model: 'm', prompt });

function fleet(ids: string[], kv: 'mocker' | 'none' = 'mocker', self = 'me') {
  const pool = new WorkerPool();
  const feed = new KvFeed(log, { self });
  const event = { type: 'reset' as const, records: ids.map((id) => rec(id, kv)) };
  pool.apply(event);
  feed.apply(event);
  const router = new Router(pool, { kind: 'kv', feed });
  /** One request routed as Upstream routes it: prepare, pick, begin, admitted. */
  const route = async (prompt: string | GenerateBody, tried = new Set<string>()) => {
    const hint = await router.prepare(typeof prompt === 'string' ? body(prompt) : prompt, 'aggregated', tried, []);
    const w = router.pick('m', 'aggregated', tried, [], hint)!;
    const done = router.begin(w, hint);
    router.routed(w, hint);
    return { id: w.record.worker_id, done, cached: hint?.chosen?.cachedTokens ?? 0, tokens: hint?.tokens ?? 0, worker: w };
  };
  return { pool, feed, router, route };
}

describe('kv index', () => {
  it('counts the leading blocks each worker holds, and forgets a dropped worker entirely', () => {
    const index = new KvIndex();
    const doc = blockHashes(mockerTokenIds(words('d', 160))); // 10 blocks
    const a = index.replace('a', 'm', 'exact', 'i1');
    const b = index.replace('b', 'm', 'exact', 'i1');
    for (const h of doc.slice(0, 10)) index.add(a, h);
    for (const h of doc.slice(0, 4)) index.add(b, h);
    index.add(b, doc[6]!); // not contiguous: does not count
    const q = index.query('m', doc);
    assert.equal(index.overlap(q, 'a'), 10);
    assert.equal(index.overlap(q, 'b'), 4);
    assert.equal(index.overlap(q, 'c'), 0);
    assert.equal(index.overlap(index.query('other', doc), 'a'), 0, 'per model');
    index.remove(a, doc[2]!);
    assert.equal(index.overlap(index.query('m', doc), 'a'), 2, 'a removed block cuts the prefix');
    index.drop('a');
    index.drop('b');
    assert.equal(index.entries, 0);
    assert.equal(index.blocksOf('m'), 0, 'no block is left behind by dropped workers');
    // A new incarnation replaces the old one's entries.
    const a1 = index.replace('a', 'm', 'exact', 'i1');
    index.add(a1, doc[0]!);
    index.replace('a', 'm', 'exact', 'i2');
    assert.equal(index.blocksOf('m'), 0);
    index.add(a1, doc[1]!);
    assert.equal(index.blocksOf('m'), 0, "a replaced holder's late events are ignored");
  });

  it('expires approximate entries and bounds them, oldest first', () => {
    const index = new KvIndex();
    const h = index.replace('a', 'm', 'approximate', 'x');
    const doc = blockHashes(mockerTokenIds(words('d', 64)));
    for (const [i, hash] of doc.entries()) index.add(h, hash, 1000 + i);
    assert.equal(index.overlap(index.query('m', doc, 999), 'a'), 4);
    assert.equal(index.overlap(index.query('m', doc, 1001), 'a'), 0, 'the first block expired');
    index.trim(h, 1001, 10);
    assert.equal(h.blocks.size, 2, 'expired ones trimmed');
    index.trim(h, 0, 1);
    assert.equal(h.blocks.size, 1, 'bounded');
  });
});

describe('kv router', () => {
  it('follows the cache, spreads cold prompts, and weighs overlap against load so a hot worker does not collect everything', async () => {
    const { route, router, pool } = fleet(['a', 'b', 'c']);
    const docs = ['x', 'y', 'z'].map((t) => words(t, 800));
    const first = [] as string[];
    for (const d of docs) {
      const r = await route(d);
      r.done();
      first.push(r.id);
    }
    assert.equal(new Set(first).size, 3, 'cold prompts on an idle fleet rotate');
    for (const [i, d] of docs.entries()) {
      const r = await route(`${d} follow-up ${i}`);
      r.done();
      assert.equal(r.id, first[i], 'a follow-up goes where its document is');
      assert.ok(r.cached >= 784, `predicted cached tokens: ${r.cached}`);
    }
    // Load: pile requests on the worker holding doc x; past what the cache saves, others take it.
    const hot = pool.get(first[0]!)!;
    hot.inflight = 20; // 20 x 64 tokens of load > 800 tokens saved
    const r = await route(`${docs[0]} again`);
    r.done();
    assert.notEqual(r.id, first[0], 'a saturated worker loses to a cold idle one');
    hot.inflight = 0;
    // Queued prefill counts while first tokens are awaited.
    const pending = await route(`${docs[1]} q1`);
    assert.equal(pending.id, first[1]);
    // Its uncached tokens, no more: what the worker must still prefill.
    assert.ok(pending.cached > 0 && pending.tokens > pending.cached, `the follow-up is partly cached (${pending.cached}/${pending.tokens} cached)`);
    assert.equal(router.queuedPrefill(first[1]!), pending.tokens - pending.cached);
    const other = await route(words('w', 40));
    assert.notEqual(other.id, first[1], 'a cold prompt goes where no prefill is queued');
    assert.equal(router.queuedPrefill(first[1]!), pending.tokens - pending.cached, "another worker's attempt does not count here");
    other.done();
    pending.done();
    assert.equal(router.queuedPrefill(first[1]!), 0, 'the first token takes it off');
  });

  it('moves a continuation to the worker holding its prompt and what was delivered, not only its prompt', async () => {
    const { route, pool, feed } = fleet(['a', 'b', 'c']);
    const prompt = words('p', 400); // 25 whole blocks
    const delivered = words('w', 40); // 2 more blocks after the prompt
    // c holds the prompt; b holds the prompt and the delivered words, and was picked last (c wins a tie).
    feed.sent(pool.get('c')!.record, blockHashes(mockerTokenIds(prompt)));
    feed.sent(pool.get('b')!.record, blockHashes(mockerTokenIds(`${prompt} ${delivered}`)));
    pool.picked(pool.get('b')!);
    // The stream leaves a: its continuation is hashed with what it delivered.
    const moved = await route({ model: 'm', prompt, continuation: { text: delivered, completion_tokens: 40 } }, new Set(['a']));
    moved.done();
    assert.equal(moved.id, 'b', 'the continuation goes where prompt + delivered are cached');
    assert.equal(moved.cached, 432, 'predicted: 27 blocks');
  });

  it('never scores a held (draining) or tried worker, and a worker out of discovery keeps its entries masked until it returns', async () => {
    const { route, pool, feed, router } = fleet(['a', 'b']);
    const doc = words('d', 400);
    const first = await route(doc);
    first.done();
    const home = first.id;
    const other = home === 'a' ? 'b' : 'a';
    pool.hold(home, 'draining');
    const moved = await route(`${doc} 1`);
    moved.done();
    assert.equal(moved.id, other, 'a draining worker is never chosen, however good its overlap');
    assert.equal(router.pick('m', 'aggregated', new Set([other]), [], await router.prepare(body(doc), 'aggregated', new Set([other]), [])), undefined, 'tried and held: nobody');
    // It leaves discovery (drained): its entries stay, masked.
    pool.apply({ type: 'delete', worker_id: home });
    feed.apply({ type: 'delete', worker_id: home });
    assert.equal(feed.describe(home)?.masked, true);
    assert.ok((feed.describe(home)?.cached_blocks ?? 0) >= 25);
    // Resumed: warm at once.
    pool.apply({ type: 'put', record: rec(home) });
    feed.apply({ type: 'put', record: rec(home) });
    const back = await route(`${doc} 3`);
    back.done();
    assert.equal(back.id, home, 'a resumed worker gets its prompts back at once');
    assert.ok(back.cached >= 384);
    await feed.close();
  });

  it('round-robin and least-loaded ignore the cache; one routable worker skips tokenizing', async () => {
    const pool = new WorkerPool();
    pool.apply({ type: 'reset', records: [rec('a'), rec('b'), rec('c')] });
    const rr = new Router(pool, { kind: 'round-robin' });
    const seen = [0, 1, 2, 3, 4, 5].map(() => rr.pick('m', 'aggregated', new Set(), [])!.record.worker_id);
    assert.deepEqual(seen.slice(3), seen.slice(0, 3), 'round robin repeats its order');
    assert.equal(new Set(seen).size, 3);
    const { router } = fleet(['solo']);
    assert.equal(await router.prepare(body(words('d', 100)), 'aggregated', new Set(), []), undefined, 'a single worker: nothing to score');
  });

  it("keeps a conversation's next turn on its cache while another prompt is prefilled there (a queued prefill holds a short one up by its own size at most)", async () => {
    const { route, router, pool } = fleet(['a', 'b', 'c']);
    const doc = words('x', 800);
    const first = await route(doc);
    first.done();
    // A long cold prompt sent to that worker, its first token not back yet.
    const hint = (await router.prepare(body(words('y', 800)), 'aggregated', new Set(), []))!;
    hint.chosen = { workerId: first.id, cachedTokens: 0 };
    const cold = { done: router.begin(pool.get(first.id)!, hint) };
    assert.equal(router.queuedPrefill(first.id), 800);
    const next = await route(`${doc} and a follow-up question`);
    next.done();
    assert.equal(next.id, first.id, `the follow-up (${next.tokens - next.cached} uncached tokens) stays with its ${next.cached} cached ones`);
    // A cold prompt as long as the queued one still goes elsewhere: it would wait for all of it.
    const another = await route(words('z', 800));
    another.done();
    assert.notEqual(another.id, first.id, 'a cold prompt goes where no prefill is queued');
    cold.done();
  });

  it("adds what other frontends sent a worker (its load events) to this frontend's own counts, leaving out its own entry", async () => {
    const { route, feed } = fleet(['a', 'b'], 'mocker', 'me');
    const doc = words('x', 400);
    const first = await route(doc);
    first.done();
    const home = first.id;
    // Another frontend has a long prompt queued there, and requests in flight: this frontend's follow-up of a short question stays...
    const load = (frontends: Record<string, [number, number[]]>) => assert.equal(feed.load.apply(home, { worker_id: home, frontends }), true);
    load({ other: [1, [400]] });
    const stay = await route(`${doc} q1`);
    stay.done();
    assert.equal(stay.id, home, 'a short prefill is held up by its own size at most');
    // ...but a cold prompt as long goes to the idle worker, as it would had this frontend sent the other one itself
    // (though that one was the busier lately here, which alone would make it win the tie).
    const warm = await route(words('w', 50));
    warm.done();
    assert.notEqual(warm.id, home);
    const cold = await route(words('c', 400));
    cold.done();
    assert.notEqual(cold.id, home, "another frontend's queued prefill counts");
    // Past what the cache saves (in-flight elsewhere), the follow-up moves too.
    load({ other: [20, []] });
    const moved = await route(`${doc} q2`);
    moved.done();
    assert.notEqual(moved.id, home, "other frontends' in-flight counts");
    // This frontend's own entry is its own counts, already known here: not added twice.
    load({ me: [20, [4000]] });
    const back = await route(`${doc} q3`);
    back.done();
    assert.equal(back.id, home, 'its own entry is left out');
    // A worker whose stream broke says nothing any more.
    load({ other: [20, []] });
    assert.equal(feed.load.of(home)?.inflight, 20);
    feed.load.drop(home);
    assert.equal(feed.load.of(home), undefined);
  });

  it('breaks ties by when a worker was last busy for anyone (its KV events, alike at every frontend), so frontends spread new prompts as one would', async () => {
    // Two frontends' routers over the same two workers, each of which stored blocks at another moment (exact holders, as from /kv/events).
    const one = fleet(['a', 'b']);
    const two = fleet(['a', 'b']);
    for (const f of [one, two]) {
      f.feed.index.replace('a', 'm', 'exact', 'i').storedAt = performance.now();
      f.feed.index.replace('b', 'm', 'exact', 'i').storedAt = performance.now() - 1000;
    }
    const r1 = await one.route(words('n', 200));
    const r2 = await two.route(words('o', 200));
    r1.done();
    r2.done();
    assert.equal(r1.id, 'b', 'the worker idle longest takes a cold prompt');
    assert.equal(r2.id, 'b', 'every frontend agrees (each one alone would pick by its own picks)');
    // This frontend's own choice counts as busy too: its next cold prompt goes to the other worker.
    const r3 = await one.route(words('p', 200));
    r3.done();
    assert.equal(r3.id, 'a');
  });

  it('approximates in character chunks for workers that declare no cache', async () => {
    const { route } = fleet(['a', 'b'], 'none');
    const doc = words('c', 300);
    const first = await route(doc);
    first.done();
    const again = await route(`${doc} more`);
    assert.equal(again.id, first.id);
    assert.ok(again.cached > 0);
  });
});

describe('what a prompt would evict', () => {
  it('counts the blocks a worker stored lately, halved every half-life, and the model\'s largest count without visiting the workers', () => {
    const index = new KvIndex();
    const a = index.replace('a', 'm', 'exact', 'i');
    const b = index.replace('b', 'm', 'exact', 'i');
    index.stored(a, 100, 1_000);
    index.stored(b, 40, 1_000 + RECENT_HALF_LIFE_MS);
    assert.equal(Math.round(a.recentBlocks(1_000 + RECENT_HALF_LIFE_MS)), 50);
    assert.equal(Math.round(index.recentMax('m', 1_000 + RECENT_HALF_LIFE_MS)), 50);
    index.stored(b, 40, 1_000 + RECENT_HALF_LIFE_MS);
    assert.equal(Math.round(index.recentMax('m', 1_000 + 2 * RECENT_HALF_LIFE_MS)), 40, "b's 80 blocks, halved once, pass a's 100 halved twice");
    assert.equal(index.recentMax('other', 0), 0);
  });

  it('costs a conversation\'s next turn next to nothing and a new one as much as the share of the cache stored lately', () => {
    assert.equal(evictionCost(2_800, 512, 1_024), 1_400);
    assert.equal(evictionCost(2_800, 2_048, 2_048), 2_800, 'a cache turning over: the worker that stored the most evicts a live block with each');
    assert.equal(evictionCost(20, 512, 1_024), 10);
    assert.equal(evictionCost(2_800, 0, 1_024), 0);
    assert.equal(evictionCost(2_800, 512, 0), 0, 'no capacity named: nothing');
  });
});

describe('router flags', () => {
  it('--router and --kv-overlap-weight are checked at parse time, on ebb frontend and ebb up', async () => {
    const { spawnSync } = await import('node:child_process');
    const { CLI } = await import('./helpers/processes.js');
    const ebb = (args: string[]) => spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8', timeout: 30_000 });
    for (const cmd of ['frontend', 'up']) {
      const bad = ebb([cmd, '--router', 'random']);
      assert.notEqual(bad.status, 0);
      assert.match(bad.stderr, /Allowed choices are kv, least-loaded, round-robin/);
      assert.match(ebb([cmd, '--kv-overlap-weight', '-1']).stderr, /expected a number >= 0, got "-1"/);
      assert.match(ebb([cmd, '--help']).stdout, /--kv-overlap-weight <w>/);
    }
  });
});
