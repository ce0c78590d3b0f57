import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { PrefillCompute } from '../src/engine/prefill-compute.js';

/**
 * The mocker's prefill budget is shared: prefills running together each go slower. Checked by
 * order, not by time: timers fire in the order they are due, however loaded the machine.
 */
describe('PrefillCompute: one prefill budget per worker', () => {
  it('two prefills together finish after the same prefill alone on an idle budget, and together', async () => {
    const signal = new AbortController().signal;
    const shared = new PrefillCompute(12_000);
    const idle = new PrefillCompute(12_000);
    const order: string[] = [];
    const a = shared.run(1200, signal).then(() => order.push('a'));
    const b = shared.run(1200, signal).then(() => order.push('b'));
    const alone = idle.run(1200, signal).then(() => order.push('alone'));
    assert.equal(shared.running, 2);
    await Promise.all([a, b, alone]);
    assert.equal(order[0], 'alone', `each of two sharing the budget takes twice as long: ${order.join(', ')}`);
    assert.equal(shared.running, 0);
  });

  it('a prefill aborted leaves the budget to the others', async () => {
    const shared = new PrefillCompute(12_000);
    const idle = new PrefillCompute(12_000);
    const cut = new AbortController();
    const order: string[] = [];
    const gone = shared.run(100_000, cut.signal).catch(() => order.push('aborted'));
    const kept = shared.run(1200, new AbortController().signal).then(() => order.push('kept'));
    cut.abort(new Error('client left'));
    const alone = idle.run(1300, new AbortController().signal).then(() => order.push('alone'));
    await Promise.all([gone, kept, alone]);
    assert.deepEqual(order, ['aborted', 'kept', 'alone'], 'the one left runs at the full rate');
  });
});
