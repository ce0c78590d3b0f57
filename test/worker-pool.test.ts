import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { WorkerPool, HOLD_MS, MODEL_MEMORY_MS } from '../src/frontend/routing/worker-pool.js';
import type { LoadingRecord, WorkerRecord } from '../src/discovery/discovery.js';

const rec = (id: string, model = 'm', mode: WorkerRecord['mode'] = 'aggregated'): WorkerRecord => ({
  worker_id: id,
  model,
  mode,
  request_url: `http://${id}`,
  system_url: `http://${id}-sys`,
});

describe('worker pool routing', () => {
  it('picks the least in-flight worker and rotates ties', () => {
    const pool = new WorkerPool();
    pool.apply({ type: 'reset', records: [rec('a'), rec('b'), rec('c')] });
    const firsts = new Set([0, 1, 2].map(() => pool.pick('m', 'aggregated', new Set())!.record.worker_id));
    assert.equal(firsts.size, 3, 'ties rotate across the fleet');
    pool.get('a')!.inflight = 3;
    pool.get('b')!.inflight = 1;
    pool.get('c')!.inflight = 2;
    assert.equal(pool.pick('m', 'aggregated', new Set())!.record.worker_id, 'b');
    assert.equal(pool.pick('m', 'aggregated', new Set(['b']))!.record.worker_id, 'c', 'skips workers already tried');
    assert.equal(pool.pick('other', 'aggregated', new Set()), undefined);
    assert.equal(pool.pick('m', 'decode', new Set()), undefined);
  });

  it('holds a refusing worker out until it expires or discovery re-registers it', () => {
    const pool = new WorkerPool();
    pool.apply({ type: 'reset', records: [rec('a')] });
    const now = Date.now();
    pool.hold('a', 'draining', now);
    assert.equal(pool.pick('m', 'aggregated', new Set(), [], now), undefined);
    assert.deepEqual(pool.models(), ['m'], 'a model whose only worker is draining is still a model');
    assert.ok(pool.pick('m', 'aggregated', new Set(), [], now + HOLD_MS.draining + 1), 'the hold expires');
    pool.hold('a', 'draining', now);
    pool.apply({ type: 'put', record: rec('a') });
    assert.ok(pool.pick('m', 'aggregated', new Set(), [], now), 'a re-registration ends the hold');
  });

  it('remembers a model for a while after its last worker left discovery: 503, not 404', () => {
    const pool = new WorkerPool();
    pool.apply({ type: 'reset', records: [rec('a')] });
    pool.apply({ type: 'delete', worker_id: 'a' });
    assert.equal(pool.hasModel('m'), false);
    assert.equal(pool.knows('m'), true);
    assert.equal(pool.knows('m', Date.now() + MODEL_MEMORY_MS + 1), false, 'forgotten after MODEL_MEMORY_MS');
    assert.equal(pool.knows('never'), false);
  });

  it('a loading worker is never routed to, yet its model is known and its requests may wait for it: on the side that generates, until it serves or its record goes', () => {
    const loading = (id: string, model = 'm', mode: WorkerRecord['mode'] = 'aggregated'): LoadingRecord => ({ worker_id: id, model, mode, system_url: `http://${id}-sys`, loading: { since: '2025-01-01T00:00:00.000Z' } });
    const pool = new WorkerPool();
    pool.apply({ type: 'reset', records: [], loading: [loading('a')] });
    assert.equal(pool.knows('m'), true);
    assert.deepEqual(pool.knownModels(), ['m']);
    assert.equal(pool.hasModel('m'), false, 'nothing routable');
    assert.equal(pool.routable('m'), 0);
    assert.equal(pool.pick('m', 'aggregated', new Set()), undefined);
    assert.equal(pool.loadingFor('m'), true);
    assert.equal(pool.loadingFor('m', new Set(['a'])), false, 'not the one a request skips');
    pool.apply({ type: 'put', record: rec('a') });
    assert.equal(pool.loadingFor('m'), false, 'serving now');
    assert.ok(pool.pick('m', 'aggregated', new Set()));
    // Disaggregated: the prefill side serves, the decode side loads. Only the decode side generates.
    pool.apply({ type: 'reset', records: [rec('p', 'split', 'prefill')], loading: [loading('q', 'split', 'prefill')] });
    assert.equal(pool.loadingFor('split'), false, 'a prefill worker alone generates nothing');
    pool.apply({ type: 'loading', record: loading('d', 'split', 'decode') });
    assert.equal(pool.loadingFor('split'), true);
    assert.equal(pool.servingPath('split'), 'disaggregated');
    assert.equal(pool.routable('split'), 0, 'no decode worker serves yet');
    // A restart under its id: the serving worker leaves the routing while it loads again.
    pool.apply({ type: 'put', record: rec('d', 'split', 'decode') });
    assert.equal(pool.routable('split'), 1);
    pool.apply({ type: 'loading', record: loading('d', 'split', 'decode') });
    assert.equal(pool.routable('split'), 0);
    // One that never comes up: its model stays known a while (a 503 its clients retry), and nothing waits for it.
    pool.apply({ type: 'reset', records: [], loading: [loading('x', 'gone')] });
    pool.apply({ type: 'delete', worker_id: 'x' });
    assert.equal(pool.loadingFor('gone'), false);
    assert.equal(pool.knows('gone'), true);
    assert.equal(pool.knows('gone', Date.now() + MODEL_MEMORY_MS + 1), false);
    // A reset without it drops it too.
    pool.apply({ type: 'reset', records: [], loading: [loading('y')] });
    pool.apply({ type: 'reset', records: [] });
    assert.equal(pool.loadingFor('m'), false);
  });

  it("a worker's own pool (--openai-port) never forgets its model and adapters: started drained or drained for long, a 503", () => {
    const own: WorkerRecord = { ...rec('a'), adapters: { slots: 1, load_ms: 0, available: ['lora-x'], resident: {} } };
    const pool = new WorkerPool(undefined, own);
    pool.apply({ type: 'reset', records: [] });
    const later = Date.now() + MODEL_MEMORY_MS + 1;
    assert.equal(pool.knows('m', later), true, 'never registered, yet known');
    assert.deepEqual(pool.knownModels(later), ['m']);
    assert.deepEqual(pool.adapterBase('lora-x', later), { base: 'm', inDiscovery: false });
    assert.deepEqual(pool.knownAdapters(later), [{ name: 'lora-x', base: 'm', available: false }]);
    pool.apply({ type: 'put', record: own });
    assert.deepEqual(pool.adapterBase('lora-x'), { base: 'm', inDiscovery: true }, 'registered: in discovery');
    pool.apply({ type: 'delete', worker_id: 'a' });
    assert.equal(pool.knows('m', later), true, 'drained past MODEL_MEMORY_MS: still known');
    assert.equal(pool.knows('other', later), false);
  });

  it('replaces its view on reset and follows deletes', () => {
    const pool = new WorkerPool();
    pool.apply({ type: 'reset', records: [rec('a'), rec('b')] });
    pool.apply({ type: 'delete', worker_id: 'a' });
    assert.deepEqual(pool.all().map((w) => w.record.worker_id), ['b']);
    pool.apply({ type: 'reset', records: [rec('c', 'm', 'prefill'), rec('d', 'm', 'decode')] });
    assert.deepEqual(pool.all().map((w) => w.record.worker_id), ['c', 'd']);
    assert.equal(pool.servingPath('m'), 'disaggregated');
    pool.apply({ type: 'put', record: rec('e') });
    assert.equal(pool.servingPath('m'), 'aggregated', 'aggregated workers win when present');
    pool.apply({ type: 'reset', records: [rec('d', 'm', 'decode')] });
    assert.equal(pool.servingPath('m'), 'disaggregated', 'decode workers alone still serve (evaluating the prompt themselves)');
  });

  it('keeps in-flight counts across a delete and re-put, and across a reset that drops and re-adds a worker', () => {
    const pool = new WorkerPool();
    pool.apply({ type: 'reset', records: [rec('a'), rec('b')] });
    const releases = [pool.acquire(pool.get('a')!), pool.acquire(pool.get('a')!)];
    pool.apply({ type: 'delete', worker_id: 'a' });
    assert.equal(pool.get('a'), undefined, 'not routable while gone');
    assert.equal(pool.inflight().get('a'), 2, 'its open requests still count');
    pool.apply({ type: 'put', record: rec('a') });
    assert.equal(pool.get('a')!.inflight, 2, 'back with its open requests');
    assert.equal(pool.pick('m', 'aggregated', new Set())!.record.worker_id, 'b', 'new requests do not pile onto it');
    pool.apply({ type: 'reset', records: [rec('b')] });
    pool.apply({ type: 'reset', records: [rec('a'), rec('b')] });
    assert.equal(pool.get('a')!.inflight, 2, 'a reset that drops and re-adds it keeps the count');
    releases[0]!();
    releases[0]!();
    assert.equal(pool.get('a')!.inflight, 1, 'release is idempotent');
    pool.apply({ type: 'delete', worker_id: 'a' });
    releases[1]!();
    assert.equal(pool.inflight().has('a'), false, 'a departed worker with nothing open is forgotten');
    pool.apply({ type: 'put', record: rec('a') });
    assert.equal(pool.get('a')!.inflight, 0);
  });
});

describe('worker pool index', () => {
  it('follows acquire and release: the least in-flight worker is picked, ties rotate through all', () => {
    const pool = new WorkerPool();
    const ids = Array.from({ length: 50 }, (_, i) => `w${i}`);
    pool.apply({ type: 'reset', records: ids.map((id) => rec(id)) });
    const seen = new Set<string>();
    for (let i = 0; i < ids.length; i++) seen.add(pool.pick('m', 'aggregated', new Set())!.record.worker_id);
    assert.equal(seen.size, ids.length, 'n picks on an idle fleet of n visit every worker');
    const releases = ids.filter((id) => id !== 'w7').map((id) => pool.acquire(pool.get(id)!));
    assert.equal(pool.pick('m', 'aggregated', new Set())!.record.worker_id, 'w7', 'the only idle worker');
    const r7 = pool.acquire(pool.get('w7')!);
    pool.acquire(pool.get('w7')!);
    releases[3]!(); // w3 back to 0
    assert.equal(pool.pick('m', 'aggregated', new Set())!.record.worker_id, 'w3', 'a release re-ranks the worker');
    r7();
    assert.equal(pool.get('w7')!.inflight, 1);
  });

  it('skips tried, held and incapable workers without losing the order of the rest', () => {
    const pool = new WorkerPool();
    const caps = { json_object: true, json_schema: false, logprobs: false, tools: false, max_context: null, continuation: false, prompt_token_ids: false, embeddings: false, sampling: false };
    pool.apply({ type: 'reset', records: [rec('a'), rec('b'), rec('c'), { ...rec('d'), capabilities: caps }] });
    for (const [id, n] of [['a', 0], ['b', 1], ['c', 2], ['d', 3]] as const) for (let i = 0; i < n; i++) pool.acquire(pool.get(id)!);
    const now = Date.now();
    pool.hold('a', 'overloaded', now);
    assert.equal(pool.pick('m', 'aggregated', new Set(), [], now)!.record.worker_id, 'b', 'a held');
    assert.equal(pool.pick('m', 'aggregated', new Set(['b']), [], now)!.record.worker_id, 'c', 'b tried');
    assert.equal(pool.pick('m', 'aggregated', new Set(), ['json_object'], now)!.record.worker_id, 'd', 'only d declares it');
    assert.equal(pool.pick('m', 'aggregated', new Set(['d']), ['json_object'], now), undefined);
    assert.equal(pool.pick('m', 'aggregated', new Set(), [], now + HOLD_MS.overloaded + 1)!.record.worker_id, 'a', 'hold expired');
  });

  it('moves a worker whose registration changes model or mode, and counts per model stay right', () => {
    const pool = new WorkerPool();
    pool.apply({ type: 'reset', records: [rec('a'), rec('b')] });
    pool.apply({ type: 'put', record: rec('a', 'other', 'decode') });
    assert.equal(pool.pick('m', 'aggregated', new Set(['b'])), undefined, 'a left m/aggregated');
    assert.equal(pool.pick('other', 'decode', new Set())!.record.worker_id, 'a');
    assert.deepEqual(pool.models(), ['m', 'other']);
    pool.apply({ type: 'delete', worker_id: 'b' });
    assert.equal(pool.hasModel('m'), false);
    assert.equal(pool.hasModel('other', 'decode'), true);
    assert.equal(pool.hasModel('other', 'aggregated'), false);
  });

  it('agrees with a full scan over random acquires, releases, holds, tries and discovery events', () => {
    let seed = 42;
    const rand = (n: number) => {
      seed = (seed * 1103515245 + 12345) & 0x7fffffff;
      return seed % n;
    };
    const pool = new WorkerPool();
    const ids = Array.from({ length: 40 }, (_, i) => `w${i}`);
    pool.apply({ type: 'reset', records: ids.map((id) => rec(id)) });
    const releases: (() => void)[] = [];
    let now = Date.now();
    for (let step = 0; step < 5000; step++) {
      const op = rand(10);
      const id = ids[rand(ids.length)]!;
      if (op < 4) {
        const w = pool.get(id);
        if (w) releases.push(pool.acquire(w));
      } else if (op < 7 && releases.length > 0) releases.splice(rand(releases.length), 1)[0]!();
      else if (op === 7) pool.hold(id, 'overloaded', now);
      else if (op === 8) pool.apply(rand(2) === 0 ? { type: 'delete', worker_id: id } : { type: 'put', record: rec(id) });
      else now += 100;
      const tried = new Set(Array.from({ length: rand(3) }, () => ids[rand(ids.length)]!));
      const eligible = pool.all().filter((w) => !tried.has(w.record.worker_id) && !(w.hold && w.hold.until > now));
      const picked = pool.pick('m', 'aggregated', tried, [], now);
      if (eligible.length === 0) assert.equal(picked, undefined);
      else {
        assert.ok(picked && eligible.includes(picked), `step ${step}: an eligible worker`);
        assert.equal(picked.inflight, Math.min(...eligible.map((w) => w.inflight)), `step ${step}: the least in flight`);
      }
    }
  });
});
