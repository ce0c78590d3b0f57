import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { Slots } from '../src/engine/slots.js';
import { call, openLineStream } from './helpers/http.js';
import { metricValue, startFleet, startWorker, tempDiscoveryUrl, type EbbProcess, type LogLine } from './helpers/processes.js';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

/** Two batch slots, one kept for priority work: one flex stream fills what flex may use. */
const SMALL_BATCH = ['--mocker-batch-slots', '2', '--priority-reserve-slots', '1', '--mocker-itl-ms', '20'];
/** Far longer than any case: a stream that runs until the test aborts it. */
const ENDLESS = 100_000;

describe('priority reserve: flex leaves a batch slot free for priority work', () => {
  it('a worker whose flex slots are full refuses another flex with worker_overloaded, and admits a priority request at once', async () => {
    const w = await startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'm1', ...SMALL_BATCH]);
    started.push(w);
    const generate = (tier: string, max_tokens: number) => openLineStream(`${w.requestUrl}/generate`, { model: 'm1', prompt: 'tides', max_tokens, service_tier: tier });
    const flex = await generate('flex', ENDLESS);
    assert.equal(flex.status, 200);
    await flex.first;
    const status = (await call('GET', `${w.systemUrl}/engine/status`)).body;
    assert.deepEqual([status.free_slots, status.priority_reserve_slots, status.flex_room], [1, 1, false], 'its status says flex has no room, one slot is free');
    const refused = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'tides', max_tokens: 2, service_tier: 'flex' });
    assert.equal(refused.status, 503, 'a second flex request is refused, not queued behind the first in the engine');
    assert.equal(refused.body.error.code, 'worker_overloaded');
    // Both endless, so the status read sees both running however slow the machine (a 2-token one could end first).
    const priority = await generate('priority', ENDLESS);
    assert.equal(priority.status, 200);
    await priority.first;
    const { body } = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(body.inflight_requests, 2, 'the priority token came while the flex stream still runs');
    priority.abort();
    const short = await generate('priority', 2);
    assert.equal(short.status, 200);
    assert.ok((await short.done).some((l) => l.includes('"done":true')), 'a priority request completes beside the (endless) flex stream');
    flex.abort();
  });

  it('through a frontend: with flex queued, a priority request goes to the worker at once, before the queued flex ones, and the worker is not asked again and again', async () => {
    // A stream whose client left ends at once (not kept for a resume): ending the flex stream frees its slot.
    const { frontend, workers } = await startFleet(1, SMALL_BATCH, ['--resume-grace-ms', '0']);
    started.push(frontend, ...workers);
    const w = workers[0]!;
    const completion = (tier: string, max_tokens: number, signal?: AbortSignal) =>
      fetch(`${frontend.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'm1', prompt: 'x', max_tokens, stream: true, service_tier: tier }), signal });
    const running = new AbortController();
    const first = await completion('flex', ENDLESS, running.signal);
    const reader = first.body!.getReader();
    await reader.read();
    let mark = frontend.mark();
    const queuedFlex = [completion('flex', 2), completion('flex', 2)];
    await frontend.waitForLog(countOf('request_queued', 2, (l) => l.tier === 'flex'), 'two flex requests refused by the worker and queued', { after: mark });
    const refusals = () => metricValue(w.systemUrl, 'ebb_worker_admission_refusals_total', 'code="worker_overloaded"');
    const refusedBefore = await refusals();
    assert.ok(refusedBefore <= 2, `the worker refused each flex request at most once (${refusedBefore}); the frontend held the rest`);
    mark = frontend.mark();
    const priority = await completion('priority', 2);
    assert.equal(priority.status, 200);
    await priority.text();
    const served = frontend.logs.slice(mark).filter((l) => l.event === 'request_dequeued' && l.outcome === 'admitted').map((l) => l.tier);
    assert.deepEqual(served, [], 'no queued flex request was admitted before the priority one ended');
    const queuedPriority = frontend.logs.slice(mark).filter((l) => l.event === 'request_queued' && l.tier === 'priority');
    assert.equal(queuedPriority.length, 0, 'the priority request went to the worker at once: flex waiting for room never delays priority');
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_queue_depth', 'model="m1",tier="flex",tenant="anonymous"'), 2, 'the flex ones still wait');
    assert.equal(await refusals(), refusedBefore, "the priority request's end gave flex no turn the worker would refuse");
    running.abort();
    await reader.closed.catch(() => undefined);
    const answers = await Promise.all(queuedFlex);
    assert.deepEqual(answers.map((r) => r.status), [200, 200], 'the flex stream ended: the queued flex requests are served');
    await Promise.all(answers.map((r) => r.text()));
  });
});

describe('priority reserve: an engine queue serves by tier', () => {
  it('waiting sequences get a freed slot priority first, then default, then flex, first come first served within a tier', async () => {
    const slots = new Slots(1);
    const signal = new AbortController().signal;
    await slots.acquire(signal);
    const order: string[] = [];
    const waits = (['flex', 'default', 'flex', 'priority', 'default'] as const).map((tier, i) => slots.acquire(signal, tier).then(() => order.push(`${tier}${i}`)));
    for (let i = 0; i < waits.length; i++) slots.release();
    await Promise.all(waits);
    assert.deepEqual(order, ['priority3', 'default1', 'default4', 'flex0', 'flex2']);
  });
});

function countOf(event: string, count: number, pred: (l: LogLine) => boolean): (l: LogLine) => boolean {
  let seen = 0;
  return (l) => l.event === event && pred(l) && ++seen === count;
}
