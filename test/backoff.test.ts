import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Backoff, backoffDelay, pause } from '../src/common/backoff.js';

test('back-off doubles from the first delay up to the cap, and starts short again after reset()', () => {
  const b = new Backoff({ minMs: 100, maxMs: 1000 });
  assert.deepEqual([b.next(), b.next(), b.next(), b.next(), b.next(), b.next()], [100, 200, 400, 800, 1000, 1000]);
  b.reset();
  assert.equal(b.next(), 100);
  assert.equal(backoffDelay({ minMs: 100, maxMs: 2000 }, 1000), 2000, 'a long outage stays at the cap');
});

test('jittered back-off draws each delay from [d/2, d]', () => {
  for (let attempt = 0; attempt < 8; attempt++) {
    const ceiling = Math.min(2000, 100 * 2 ** attempt);
    for (let i = 0; i < 50; i++) {
      const d = backoffDelay({ minMs: 100, maxMs: 2000, jitter: true }, attempt);
      assert.ok(d >= ceiling / 2 && d <= ceiling, `attempt ${attempt}: ${d} outside [${ceiling / 2}, ${ceiling}]`);
    }
  }
});

test('pause() resolves true once the time passed, false at once when aborted', async () => {
  assert.equal(await pause(1), true);
  const stop = new AbortController();
  const waiting = pause(60_000, stop.signal);
  stop.abort();
  assert.equal(await waiting, false);
  assert.equal(await pause(60_000, AbortSignal.abort()), false);
});
