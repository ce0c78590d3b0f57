import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { WorkerPool, HOLD_MS, MODEL_MEMORY_MS } from '../src/frontend/worker-pool.js';
import type { WorkerRecord } from '../src/discovery/discovery.js';

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
