import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { call } from './helpers/http.js';
import { frontendSeesWorkers, metricValue, startFleet, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type LogLine } from './helpers/processes.js';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

const completion = (frontend: FrontendHandle, extra: Record<string, unknown> = {}, headers: Record<string, string> = {}, signal?: AbortSignal) =>
  fetch(`${frontend.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify({ model: 'm1', prompt: 'x', max_tokens: 2, ...extra }), signal });

/** Resolves once the frontend has logged `count` more lines with `event` (from `after`). */
function events(frontend: EbbProcess, event: string, count: number, after: number, pred: (l: LogLine) => boolean = () => true): Promise<LogLine> {
  let seen = 0;
  return frontend.waitForLog((l) => l.event === event && pred(l) && ++seen === count, `${count} ${event} log line(s)`, { after });
}

async function drainAndWait(frontend: EbbProcess, w: { systemUrl: string; workerId: string }) {
  const mark = frontend.mark();
  assert.equal((await call('POST', `${w.systemUrl}/engine/drain`)).body.state, 'drained');
  await frontend.waitForEvent('worker_removed', (l) => l.worker_id === w.workerId, { after: mark });
}

describe('admission queue: when capacity shrinks, requests wait instead of failing', () => {
  it('requests sent while the only worker is drained wait, and complete once it resumes', async () => {
    const { frontend, workers } = await startFleet(1, ['--mocker-itl-ms', '2']);
    started.push(frontend, ...workers);
    const [w] = workers;
    await drainAndWait(frontend, w!);
    const mark = frontend.mark();
    const pending = [0, 1, 2].map(() => completion(frontend));
    await events(frontend, 'request_queued', 3, mark);
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_fleet_queued_requests', 'model="m1"'), 3, 'the autoscaler gauge counts them');
    assert.equal((await call('POST', `${w!.systemUrl}/engine/resume`)).body.state, 'serving');
    const answers = await Promise.all(pending);
    assert.deepEqual(answers.map((r) => r.status), [200, 200, 200], 'admitted on resume');
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_fleet_queued_requests', 'model="m1"'), 0);
  });

  it('a client leaving the queue frees its place; a full queue sheds with 429 and a Retry-After', async () => {
    const { frontend, workers } = await startFleet(1, ['--mocker-itl-ms', '2'], ['--queue-depth', '1']);
    started.push(frontend, ...workers);
    const [w] = workers;
    await drainAndWait(frontend, w!);
    let mark = frontend.mark();
    const leaving = new AbortController();
    const gone = completion(frontend, {}, {}, leaving.signal).catch((err: Error) => err);
    await events(frontend, 'request_queued', 1, mark);
    const full = await completion(frontend);
    assert.equal(full.status, 429, 'the queue holds one');
    const body = (await full.json()) as { error: { code: string; message: string } };
    assert.equal(body.error.code, 'queue_full');
    assert.match(body.error.message, /full/);
    assert.match(full.headers.get('retry-after') ?? '', /^[1-9]\d*$/, 'a Retry-After in seconds');
    mark = frontend.mark();
    leaving.abort();
    await gone;
    await events(frontend, 'request_dequeued', 1, mark, (l) => l.outcome === 'left');
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_queue_depth', 'model="m1",tier="default",tenant="anonymous"'), 0);
    mark = frontend.mark();
    const next = completion(frontend);
    await events(frontend, 'request_queued', 1, mark);
    assert.equal((await call('POST', `${w!.systemUrl}/engine/resume`)).body.state, 'serving');
    assert.equal((await next).status, 200, 'the later request took the freed place');
  });

  it('a model with no worker and none coming fails fast with 503 no_serving_worker', async () => {
    const { frontend, workers } = await startFleet(1, []);
    started.push(frontend);
    const [w] = workers;
    assert.equal((await completion(frontend)).status, 200);
    const mark = frontend.mark();
    await w!.stop();
    await frontend.waitForEvent('worker_removed', (l) => l.worker_id === w!.workerId, { after: mark });
    const res = await completion(frontend);
    assert.equal(res.status, 503, 'not queued: nothing will come');
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, 'no_serving_worker');
    assert.equal(frontend.logs.slice(mark).filter((l) => l.event === 'request_queued').length, 0);
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_queue_sheds_total', 'model="m1",reason="no_worker"'), 1);
  });

  it('--queue-timeout 0 restores the answer at once: 503 no_serving_worker while the only worker is drained', async () => {
    const discovery = tempDiscoveryUrl();
    const w = await startWorker(['--discovery', discovery, '--model', 'm1']);
    started.push(w);
    const frontend = await startFrontend(discovery, ['--queue-timeout', '0']);
    started.push(frontend);
    await frontendSeesWorkers(frontend, 1);
    await drainAndWait(frontend, w);
    const res = await completion(frontend);
    assert.equal(res.status, 503);
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, 'no_serving_worker');
    assert.equal(res.headers.get('retry-after'), null, 'no guess: the frontend knows nothing of when it comes back');
    assert.doesNotMatch(await fetch(`${frontend.url}/metrics`).then((r) => r.text()), /ebb_frontend_queue_depth/, 'no queue at all');
  });
});
