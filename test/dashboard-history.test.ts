import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { INFLIGHT_HISTORY_MS, INFLIGHT_SLOT_MS, InflightHistory } from '../src/lifecycle/inflight-history.js';
import { MODEL_STATS_WINDOW_S, ModelStats } from '../src/frontend/model-stats.js';

describe('dashboard history: a worker\'s in-flight minute', () => {
  it('keeps change points as ages, one per slot, and only the last minute (plus the point that opens it)', () => {
    const t0 = 1_000_000;
    const h = new InflightHistory(0, t0);
    h.record(1, t0 + 1000);
    h.record(2, t0 + 1000 + INFLIGHT_SLOT_MS / 2); // same slot: the slot's last value stands
    h.record(2, t0 + 2000); // no change: no point
    h.record(0, t0 + 3000);
    assert.deepEqual(h.list(t0 + 4000), [[4000, 0], [3000, 2], [1000, 0]]);
    // A minute later only the last point older than the window remains, then what follows it.
    for (let i = 0; i < 1000; i++) h.record(i % 2, t0 + 10_000 + i * 10);
    const now = t0 + 10_000 + INFLIGHT_HISTORY_MS + 5000;
    const points = h.list(now);
    assert.ok(points.length <= INFLIGHT_HISTORY_MS / INFLIGHT_SLOT_MS + 1, `bounded: ${points.length} points`);
    assert.ok(points.length >= 1);
    assert.ok(points.slice(1).every(([age]) => age < INFLIGHT_HISTORY_MS));
  });
});

describe('dashboard history: per-model figures', () => {
  it('counts requests per whole second, 5xx as errors, TTFT percentiles, over the last minute', () => {
    const s = new ModelStats();
    const t0 = 1_700_000_000_000;
    for (let i = 0; i < 20; i++) {
      s.answered('m1', i === 0 ? 503 : i === 1 ? 400 : 200, t0 + i * 100);
      s.firstToken('m1', (i + 1) / 1000, t0 + i * 100);
    }
    const [m] = s.summary(t0 + 2500);
    assert.equal(m?.model, 'm1');
    assert.equal(m?.requests, 20);
    assert.equal(m?.errors, 1, 'a 4xx is the client\'s, not counted');
    assert.equal(m?.requests_per_s, 2, '20 requests in the last 10 whole seconds');
    assert.equal(m?.rate_series.length, MODEL_STATS_WINDOW_S);
    assert.equal(m?.ttft_p50_ms, 11);
    assert.equal(m?.ttft_p95_ms, 20);
    assert.deepEqual(s.summary(t0 + 2500 + MODEL_STATS_WINDOW_S * 1000), [], 'a model with nothing in the window is dropped');
  });
});
