import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { ShutdownBudget } from '../src/worker/shutdown-budget.js';

describe('shutdown budget', () => {
  it('gives a stage its cap while the budget allows, and never what later stages reserve', () => {
    const now = performance.now();
    const fresh = new ShutdownBudget(now, 10_000);
    assert.equal(fresh.stageMs(1000, 5000), 1000, 'the cap, when the budget has room');
    assert.ok(fresh.stageMs(8000, 5000) <= 5000, 'the rest minus the reserve, when the cap is larger');
    assert.ok(fresh.stageMs(undefined, 5000) <= 5000 && fresh.stageMs(undefined, 5000) > 4900, 'no cap: all but the reserve');
    const late = new ShutdownBudget(now - 9_000, 10_000); // 9 s of 10 already spent
    assert.ok(late.stageMs(2000, 500) <= 500, 'a late stage shrinks to what is left before the reserve');
    assert.equal(late.stageMs(2000, 5000), 0, 'and gets nothing once only the reserve is left');
  });
});
