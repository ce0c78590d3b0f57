import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import type { WorkerStatus } from '../src/protocol/admin.js';
import type { WorkerMode } from '../src/protocol/worker-mode.js';
import { chooseVictims, isChoiceProblem, rankPools, type Candidate } from '../src/frontend/admin/victim-ranking.js';
import { fleetCapacity } from '../src/frontend/admin/fleet-capacity.js';

/** A serving worker's status with what the ranking reads. */
function worker(id: string, eta: number | null, opts: { inflight?: number; cached?: number; started?: string; mode?: WorkerMode } = {}): Candidate {
  const status = {
    worker_id: id,
    state: 'serving',
    inflight_requests: opts.inflight ?? (eta === 0 ? 0 : 1),
    eta_if_drained_ms: eta,
    started_at: opts.started ?? '2026-12-03T10:00:00.000Z',
    ...(opts.cached === undefined ? {} : { kv_cache: { cached_blocks: opts.cached } }),
  } as unknown as WorkerStatus;
  return { worker_id: id, mode: opts.mode ?? 'aggregated', status };
}

const ids = (c: { worker_id: string }[]) => c.map((x) => x.worker_id);

describe('victim ranking', () => {
  it('least work to wait for first; unknown drain time after every known one; in-flight breaks ETA ties', () => {
    const ranked = rankPools([worker('slow', 9000), worker('unknown', null), worker('idle', 0), worker('soon', 300, { inflight: 3 }), worker('soon-1', 300, { inflight: 1 })]).get('aggregated')!;
    assert.deepEqual(ids(ranked), ['idle', 'soon-1', 'soon', 'slow', 'unknown']);
    assert.match(ranked[0]!.reason, /^idle: nothing to wait for; 0 cached blocks/);
    assert.match(ranked[1]!.reason, /^its work ends in 300 ms \(1 in flight\)/);
    assert.match(ranked[4]!.reason, /drain time unknown/);
  });

  it('then the least cache value (kv_cache.cached_blocks, absent = 0), then the youngest', () => {
    const ranked = rankPools([
      worker('warm', 0, { cached: 500 }),
      worker('cold-old', 0, { started: '2026-12-03T09:00:00.000Z' }),
      worker('cold-young', 0, { cached: 0, started: '2026-12-03T11:00:00.000Z' }),
      worker('lukewarm', 0, { cached: 20 }),
    ]).get('aggregated')!;
    assert.deepEqual(ids(ranked), ['cold-young', 'cold-old', 'lukewarm', 'warm']);
    assert.match(ranked[3]!.reason, /500 cached blocks/);
  });

  it('ranks prefill and decode pools apart, and asks which pool when a model has both', () => {
    const fleet = [worker('p1', 0, { mode: 'prefill' }), worker('p2', 50, { mode: 'prefill' }), worker('d1', 900, { mode: 'decode' }), worker('d2', 100, { mode: 'decode' })];
    const asked = chooseVictims('m', fleet, 1);
    assert.ok(isChoiceProblem(asked) && asked.kind === 'pool_needed', JSON.stringify(asked));
    const decode = chooseVictims('m', fleet, 1, 'decode');
    assert.ok(!isChoiceProblem(decode));
    assert.deepEqual(ids(decode.victims), ['d2'], 'the idle prefill worker is not a decode victim');
    const tooMany = chooseVictims('m', fleet, 2, 'prefill');
    assert.ok(isChoiceProblem(tooMany) && tooMany.kind === 'too_many');
  });

  it('fleet capacity per model and pool: serving, drainable (leaving one), the first victim\'s drain ETA', () => {
    const entry = (c: Candidate, model = 'm') => ({ ...c, model, request_url: 'http://x', system_url: 'http://x', in_discovery: true, reachable: true });
    const draining = entry(worker('gone', 0));
    draining.status = { ...draining.status, state: 'draining', inflight_requests: 2 };
    const caps = fleetCapacity([entry(worker('a', 0)), entry(worker('b', 0)), entry(worker('c', 700)), draining, entry(worker('z', 0), 'other')]);
    assert.deepEqual(caps, [
      { model: 'm', mode: 'aggregated', serving: 3, draining: 1, inflight: 3, drainable: 2, drainEtaMs: 0 },
      { model: 'other', mode: 'aggregated', serving: 1, draining: 0, inflight: 0, drainable: 0, drainEtaMs: 0 },
    ]);
  });
});
