/**
 * Priority preemption without loss (issue 48 item 3): a priority request that finds every batch
 * slot of its worker held by flex streams pauses one; that stream's client keeps its connection,
 * sees only a pause, and gets the undisturbed text, continued once room returns.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { bounded, frontendSeesWorkers, metricValue, startFleet, startFrontend, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { sseEvents } from './helpers/http.js';
import { streamCompletion, type StreamOutcome } from './helpers/sse.js';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

/** Two batch slots, none kept back for priority: two flex streams fill the worker. */
const FULL_OF_FLEX = ['--mocker-batch-slots', '2', '--priority-reserve-slots', '0', '--mocker-itl-ms', '10', '--mocker-ttft-ms', '0'];
const FLEX_TOKENS = 80;

describe('priority preemption: a flex stream is paused for a priority request, and continued exactly', () => {
  let discovery: string;
  let frontend: FrontendHandle;
  let worker: WorkerHandle;
  /** Each seed's text with nothing else on the worker. */
  const reference: string[] = [];

  before(async () => {
    const fleet = await startFleet(1, FULL_OF_FLEX, ['--resume-grace-ms', '0']);
    ({ discovery, frontend } = fleet);
    worker = fleet.workers[0]!;
    started.push(frontend, worker);
    for (const seed of [0, 1]) {
      const r = await streamCompletion(frontend.url, { model: 'm1', max_tokens: FLEX_TOKENS, seed, temperature: 0, service_tier: 'flex' });
      assert.equal(r.tokens, FLEX_TOKENS, r.error);
      reference.push(r.text);
    }
  });

  /** Two flex streams (seeds 0 and 1), resolved once both have tokens: the worker's two slots are theirs. */
  function fillWithFlex(f: FrontendHandle, order: string[]) {
    let running = 0;
    let bothRunning!: () => void;
    const filled = new Promise<void>((resolve) => (bothRunning = resolve));
    const streams = [0, 1].map((seed) =>
      streamCompletion(f.url, { model: 'm1', max_tokens: FLEX_TOKENS, seed, temperature: 0, service_tier: 'flex', stream_options: { include_usage: true } }, undefined, (n) => {
        if (n === 3 && ++running === 2) bothRunning();
      }).then((o) => (order.push(`flex${seed}`), o)),
    );
    return { streams, filled: bounded(filled, 'both flex streams to stream 3 tokens') };
  }

  function assertUndisturbed(results: StreamOutcome[]): void {
    for (const [i, r] of results.entries()) {
      assert.equal(r.status, 200, `flex ${i}: ${r.error}`);
      assert.equal(r.error, undefined, `flex ${i} had no error event`);
      assert.equal(r.doneEvents, 1, `flex ${i}: one [DONE]`);
      assert.equal(r.chunkIds.length, 1, `flex ${i}: one id, paused or not`);
      assert.equal(r.text, reference[i], `flex ${i}: byte-identical to the undisturbed run`);
      assert.equal(r.usage?.completion_tokens, FLEX_TOKENS, `flex ${i}: usage counts the whole completion`);
    }
  }

  it('a worker full of flex streams: the priority request takes a slot at once, one flex stream pauses and completes byte-identical after it', async () => {
    const order: string[] = [];
    const { streams, filled } = fillWithFlex(frontend, order);
    await filled;
    const priority = await streamCompletion(frontend.url, { model: 'm1', max_tokens: 3, seed: 9, service_tier: 'priority' });
    order.push('priority');
    assert.equal(priority.tokens, 3, priority.error);
    const flex = await Promise.all(streams);
    assertUndisturbed(flex);
    assert.equal(await metricValue(worker.systemUrl, 'ebb_worker_preemptions_total'), 1, 'the worker paused one flex stream for the one priority request');
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_preemptions_total'), 1, 'the frontend saw it paused');
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_migrations_total', 'reason="preempted"'), 1, 'and continued it');
    assert.ok(order.indexOf('priority') < Math.max(order.indexOf('flex0'), order.indexOf('flex1')), `the paused flex stream ended after the priority request (${order.join(', ')})`);
    const paused = frontend.logs.find((l) => l.event === 'stream_preempted');
    assert.ok(paused !== undefined, 'the frontend logged the pause');
  });

  it('--preemption-limit 0: nothing is paused; the priority request waits for a slot and every stream completes', async () => {
    const f = await startFrontend(discovery, ['--resume-grace-ms', '0', '--preemption-limit', '0']);
    started.push(f);
    await frontendSeesWorkers(f, 1);
    const before = await metricValue(worker.systemUrl, 'ebb_worker_preemptions_total');
    const { streams, filled } = fillWithFlex(f, []);
    await filled;
    const priority = await streamCompletion(f.url, { model: 'm1', max_tokens: 3, seed: 9, service_tier: 'priority' });
    assert.equal(priority.tokens, 3, priority.error);
    assertUndisturbed(await Promise.all(streams));
    assert.equal(await metricValue(worker.systemUrl, 'ebb_worker_preemptions_total'), before, 'no flex stream was paused');
    assert.equal(await metricValue(f.url, 'ebb_frontend_preemptions_total'), 0);
  });
});

/** Two batch slots whose flex streams are still in their prefill (1.5 s) when the priority request comes. */
const SLOW_PREFILL = ['--mocker-batch-slots', '2', '--priority-reserve-slots', '0', '--mocker-itl-ms', '20', '--mocker-ttft-ms', '1500'];
const LONG_FLEX_TOKENS = 150;

describe('priority preemption decided again while the priority request waits in the engine\'s queue', () => {
  it('a priority request that came while every flex stream was still in its prefill (none to pause yet) pauses one at its first token, not after a whole stream', async () => {
    const { frontend, workers } = await startFleet(1, SLOW_PREFILL, ['--resume-grace-ms', '0']);
    const worker = workers[0]!;
    started.push(frontend, worker);
    const flex = (seed: number) =>
      streamCompletion(frontend.url, { model: 'm1', max_tokens: LONG_FLEX_TOKENS, seed, temperature: 0, service_tier: 'flex', stream_options: { include_usage: true } });
    const reference = await Promise.all([0, 1].map((seed) => flex(seed)));
    for (const r of reference) assert.equal(r.usage?.completion_tokens, LONG_FLEX_TOKENS, r.error);

    // Both flex streams admitted (their slots taken, their first token 1.5 s away): the worker says so on its status stream.
    const status = new AbortController();
    const statusRes = await fetch(`${worker.systemUrl}/engine/status/events`, { signal: status.signal });
    const bothAdmitted = sseEvents(statusRes, (e) => /"inflight_requests":2\b/.test(e), { controller: status });
    const order: string[] = [];
    const streams = [0, 1].map((seed) => flex(seed).then((o) => (order.push(`flex${seed}`), o)));
    await bounded(bothAdmitted, 'the worker to hold both flex streams');
    status.abort();
    assert.equal(await metricValue(worker.systemUrl, 'ebb_worker_preemptions_total'), 0);
    const priority = await streamCompletion(frontend.url, { model: 'm1', max_tokens: 3, seed: 9, service_tier: 'priority' });
    order.push('priority');
    assert.equal(priority.tokens, 3, priority.error);
    const results = await Promise.all(streams);
    assert.equal(order[0], 'priority', `the priority request was answered before either flex stream ended (${order.join(', ')})`);
    assert.equal(await metricValue(worker.systemUrl, 'ebb_worker_preemptions_total'), 1, 'one flex stream paused, once it had a token');
    for (const [i, r] of results.entries()) {
      assert.equal(r.error, undefined, `flex ${i}: ${r.error}`);
      assert.equal(r.doneEvents, 1, `flex ${i}: one [DONE]`);
      assert.equal(r.text, reference[i]!.text, `flex ${i}: byte-identical to the undisturbed run`);
      assert.equal(r.usage?.completion_tokens, LONG_FLEX_TOKENS, `flex ${i}: usage counts the whole completion`);
    }
  });
});
