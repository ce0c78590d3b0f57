/**
 * The fleet benches' load (bench/open-loop.ts): what the admission and lora benches count as a
 * client's error, TTFT and popularity must be right, or their figures are.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { prng } from '../src/engine/mocker.js';
import { openLoop, summarize, timedCompletion, zipf, type Sample } from '../bench/open-loop.js';
import { percentile } from '../bench/percentile.js';
import { metricSum, metricValue, startFleet, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';

describe('bench load: a request as its client saw it', () => {
  let frontend: FrontendHandle;
  let workers: WorkerHandle[];
  before(async () => {
    ({ frontend, workers } = await startFleet(1, ['--mocker-itl-ms', '1']));
  });
  after(async () => {
    await Promise.all([frontend, ...workers].map((p) => p.stop()));
  });

  it('is ok with a TTFT and its worker when whole; an error with its code otherwise', async () => {
    const whole = await timedCompletion(frontend.url, 'x', { model: 'm1', max_tokens: 4 });
    assert.equal(whole.ok, true, JSON.stringify(whole));
    assert.ok(whole.ttftMs !== undefined && whole.ttftMs <= whole.endedAt - whole.sentAt, JSON.stringify(whole));
    assert.equal(whole.workerId, workers[0]?.workerId);
    const unknown = await timedCompletion(frontend.url, 'x', { model: 'nobody-serves-this', max_tokens: 4 });
    assert.deepEqual([unknown.ok, unknown.status, unknown.code, unknown.ttftMs], [false, 404, 'model_not_found', undefined]);
    const s = summarize([whole, unknown]);
    assert.deepEqual([s.requests, s.ok, s.errors, s.codes], [2, 1, 1, { model_not_found: 1 }]);
  });

  it('open loop: stop() resolves once every request sent has ended', async () => {
    let sent = 0;
    let fifth!: () => void;
    const fiveSent = new Promise<void>((resolve) => (fifth = resolve));
    const load = openLoop(50, (i) => {
      if (++sent === 5) fifth();
      return timedCompletion(frontend.url, 'x', { model: 'm1', max_tokens: 20, seed: i });
    });
    await fiveSent;
    const samples: Sample[] = await load.stop();
    assert.equal(samples.length, sent, 'one sample per request sent, none still running');
    assert.ok(samples.every((s) => s.ok), JSON.stringify(summarize(samples)));
  });

  it('metricSum adds a metric over its labels', async () => {
    const url = workers[0]!.systemUrl;
    assert.equal(await metricSum(url, 'ebb_worker_admitted_total'), await metricValue(url, 'ebb_worker_admitted_total'));
    assert.equal(await metricSum(url, 'no_such_metric'), 0);
  });
});

describe('bench load: popularity and percentiles', () => {
  it('zipf picks item i with weight 1/(i+1)^s', () => {
    const pick = zipf(16, 1, prng(42));
    const counts = Array<number>(16).fill(0);
    for (let i = 0; i < 20_000; i++) counts[pick()]!++;
    const harmonic = Array.from({ length: 16 }, (_, i) => 1 / (i + 1)).reduce((a, b) => a + b, 0);
    for (const i of [0, 1, 3, 15]) assert.ok(Math.abs(counts[i]! / 20_000 - 1 / (i + 1) / harmonic) < 0.01, `item ${i}: ${counts[i]} of 20000`);
  });

  it('percentile is nearest-rank', () => {
    const values = Array.from({ length: 100 }, (_, i) => 100 - i);
    assert.deepEqual([percentile(values, 50), percentile(values, 99), percentile(values, 100), percentile([7], 99)], [50, 99, 100, 7]);
    assert.ok(Number.isNaN(percentile([], 50)));
  });
});
