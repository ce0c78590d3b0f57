import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { call } from './helpers/http.js';
import { bounded, frontendSeesWorkers, metricValue, startFleet, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type LogLine } from './helpers/processes.js';

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

/** A frontend (with `args`) whose model's only worker is drained: requests queue until `w` resumes. */
async function drainedFleet(args: string[] = []) {
  const { frontend, workers } = await startFleet(1, ['--mocker-itl-ms', '2'], args);
  started.push(frontend, ...workers);
  const w = workers[0]!;
  await drainAndWait(frontend, w);
  return { frontend, w };
}

describe('admission queue: when capacity shrinks, requests wait instead of failing', () => {
  it('requests sent while the only worker is drained wait, and complete once it resumes', async () => {
    const { frontend, w } = await drainedFleet();
    const mark = frontend.mark();
    const pending = [0, 1, 2].map(() => completion(frontend));
    await events(frontend, 'request_queued', 3, mark);
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_fleet_queued_requests', 'model="m1"'), 3, 'the autoscaler gauge counts them');
    assert.equal((await call('POST', `${w.systemUrl}/engine/resume`)).body.state, 'serving');
    const answers = await Promise.all(pending);
    assert.deepEqual(answers.map((r) => r.status), [200, 200, 200], 'admitted on resume');
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_fleet_queued_requests', 'model="m1"'), 0);
  });

  it('a client leaving the queue frees its place; a full queue sheds with 429 and a Retry-After', async () => {
    const { frontend, w } = await drainedFleet(['--queue-depth', '1']);
    let mark = frontend.mark();
    const leaving = new AbortController();
    const gone = completion(frontend, {}, {}, leaving.signal).catch((err: Error) => err);
    await events(frontend, 'request_queued', 1, mark);
    const full = await completion(frontend);
    assert.equal(full.status, 429, 'the queue holds one');
    const body = (await full.json()) as { error: { code: string; type: string; param: null; message: string } };
    // OpenAI's 429: code rate_limit_exceeded, type requests; the message says it was the queue being full.
    assert.deepEqual([body.error.code, body.error.type, body.error.param], ['rate_limit_exceeded', 'requests', null]);
    assert.match(body.error.message, /full/);
    assert.equal(full.headers.get('retry-after'), '30', 'no admission rate known yet: Retry-After is the queue timeout (30 s)');
    mark = frontend.mark();
    leaving.abort();
    await gone;
    await events(frontend, 'request_dequeued', 1, mark, (l) => l.outcome === 'left');
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_queue_depth', 'model="m1",tier="default",tenant="anonymous"'), 0);
    mark = frontend.mark();
    const next = completion(frontend);
    await events(frontend, 'request_queued', 1, mark);
    assert.equal((await call('POST', `${w.systemUrl}/engine/resume`)).body.state, 'serving');
    assert.equal((await next).status, 200, 'the later request took the freed place');
  });

  it('a full queue sheds flex first: a priority request takes a waiting flex request\'s place, a flex one finds it full', async () => {
    const { frontend, w } = await drainedFleet(['--queue-depth', '1']);
    let mark = frontend.mark();
    const flex = completion(frontend, { service_tier: 'flex' });
    await events(frontend, 'request_queued', 1, mark);
    const another = await completion(frontend, { service_tier: 'flex' });
    assert.equal(another.status, 429, 'a flex request does not displace a flex one');
    mark = frontend.mark();
    const priority = completion(frontend, {}, { 'x-ebb-service-tier': 'priority' });
    const displaced = await flex;
    assert.equal(displaced.status, 429);
    assert.equal(((await displaced.json()) as { error: { code: string; message: string } }).error.message.includes('took this flex request'), true);
    assert.match(displaced.headers.get('retry-after') ?? '', /^[1-9]\d*$/);
    await events(frontend, 'request_queued', 1, mark, (l) => l.tier === 'priority');
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_queue_sheds_total', 'model="m1",reason="flex_displaced"'), 1);
    assert.equal((await call('POST', `${w.systemUrl}/engine/resume`)).body.state, 'serving');
    assert.equal((await priority).status, 200);
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

  it("a model whose only worker is restarted (SIGTERM, replaced under its id) waits for the replacement instead of failing", async () => {
    const { discovery, frontend, workers } = await startFleet(1, ['--mocker-itl-ms', '20']);
    started.push(frontend, ...workers);
    const w = workers[0]!;
    // A stream in flight keeps the old worker draining (and answering) a while after it leaves discovery.
    const inflight = await completion(frontend, { max_tokens: 40, stream: true });
    const reader = inflight.body!.getReader();
    await reader.read();
    const mark = frontend.mark();
    w.signal('SIGTERM');
    await frontend.waitForLog((l) => l.event === 'model_restarting' && l.model === 'm1', 'the frontend to take the departure as a restart', { after: mark });
    const waiting = completion(frontend);
    await events(frontend, 'request_queued', 1, mark);
    while (!(await reader.read()).done);
    await w.exitCode();
    const next = await startWorker(['--discovery', discovery, '--model', 'm1', '--worker-id', w.workerId]);
    started.push(next);
    assert.equal((await waiting).status, 200, 'served by the replacement');
  });

  it('a request no worker takes within --queue-timeout is answered 429 rate_limit_exceeded once it has waited that long', async () => {
    const { frontend } = await drainedFleet(['--queue-timeout', '1500']);
    const mark = frontend.mark();
    const res = await bounded(completion(frontend), 'the queued request to be shed at its 1.5 s queue timeout');
    assert.equal(res.status, 429);
    const body = (await res.json()) as { error: { code: string; message: string } };
    assert.equal(body.error.code, 'rate_limit_exceeded');
    assert.match(body.error.message, /within the queue timeout \(1500 ms\)/);
    assert.equal(res.headers.get('retry-after'), '2', 'no admission rate known: Retry-After is the queue timeout, rounded up');
    const left = await events(frontend, 'request_dequeued', 1, mark, (l) => l.outcome === 'shed');
    assert.ok((left.waited_ms as number) >= 1500, `shed after its full timeout, not before (${String(left.waited_ms)} ms)`);
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_queue_sheds_total', 'model="m1",reason="queue_timeout"'), 1);
  });

  it('an admission gives the next waiter its turn at once: a second request is admitted while the first still streams', async () => {
    // Nothing else changes in the fleet meanwhile: only the first's admission can give the second its turn.
    const { frontend, w } = await drainedFleet(['--queue-timeout', '10000', '--resume-grace-ms', '0']);
    const mark = frontend.mark();
    const long = new AbortController();
    const first = completion(frontend, { max_tokens: 100_000, stream: true }, {}, long.signal);
    await events(frontend, 'request_queued', 1, mark);
    const second = completion(frontend);
    await events(frontend, 'request_queued', 2, mark);
    assert.equal((await call('POST', `${w.systemUrl}/engine/resume`)).body.state, 'serving');
    const running = await first;
    assert.equal(running.status, 200);
    assert.equal((await second).status, 200, 'admitted beside the first stream, not at its end (or at the queue timeout)');
    long.abort();
    await running.body?.cancel().catch(() => undefined);
  });

  it('--queue-timeout 0 restores the answer at once: 503 no_serving_worker while the only worker is drained', async () => {
    const { frontend } = await drainedFleet(['--queue-timeout', '0']);
    const res = await completion(frontend);
    assert.equal(res.status, 503);
    assert.equal(((await res.json()) as { error: { code: string } }).error.code, 'no_serving_worker');
    assert.equal(res.headers.get('retry-after'), null, 'no guess: the frontend knows nothing of when it comes back');
    assert.doesNotMatch(await fetch(`${frontend.url}/metrics`).then((r) => r.text()), /ebb_frontend_queue_depth/, 'no queue at all');
  });
});

/** The tier (or tenant) of each admission from the queue, in the order the frontend logged them. */
async function admissions(frontend: EbbProcess, count: number, after: number, field: 'tier' | 'tenant'): Promise<string[]> {
  await events(frontend, 'request_dequeued', count, after, (l) => l.outcome === 'admitted');
  return frontend.logs
    .slice(after)
    .filter((l) => l.event === 'request_dequeued' && l.outcome === 'admitted')
    .map((l) => String(l[field]));
}

describe('admission queue: --processes 2', () => {
  it('the fleet gauge counts each queued request once, whichever process holds it', async () => {
    const discovery = tempDiscoveryUrl();
    const w = await startWorker(['--discovery', discovery, '--model', 'm1']);
    started.push(w);
    const frontend = await startFrontend(discovery, ['--processes', '2']);
    started.push(frontend);
    for (const slot of [0, 1]) await frontend.waitForLog((l) => l.event === 'frontend_process_ready' && l.slot === slot, `process ${slot} ready`);
    let seen = 0;
    await frontend.waitForLog((l) => ((l.event === 'worker_added' && l.worker_id === w.workerId) || (l.event === 'discovery_reset' && (l.workers as string[]).includes(w.workerId))) && ++seen === 2, 'both processes see the worker');
    let gone = 0;
    const mark = frontend.mark();
    assert.equal((await call('POST', `${w.systemUrl}/engine/drain`)).body.state, 'drained');
    await frontend.waitForLog((l) => l.event === 'worker_removed' && ++gone === 2, 'both processes see it leave', { after: mark });
    const queuedFrom = frontend.mark();
    // A connection each (no keep-alive): the kernel spreads them over the processes.
    const pending = [0, 1, 2, 3].map(() => completion(frontend, {}, { connection: 'close' }));
    await events(frontend, 'request_queued', 4, queuedFrom);
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_fleet_queued_requests', 'model="m1"'), 4);
    assert.equal((await call('POST', `${w.systemUrl}/engine/resume`)).body.state, 'serving');
    assert.deepEqual((await Promise.all(pending)).map((r) => r.status), [200, 200, 200, 200]);
  });
});

describe('admission queue: order', () => {
  it('priority is admitted before default before flex (body service_tier, or the x-ebb-service-tier header over it)', async () => {
    const { frontend, w } = await drainedFleet();
    const mark = frontend.mark();
    const pending: Array<Promise<Response>> = [];
    // Queued lowest first, so that arrival order alone would admit them the wrong way round.
    for (const [tier, headers] of [['flex', {}], ['auto', { 'x-ebb-service-tier': 'flex' }], ['default', {}], ['flex', { 'x-ebb-service-tier': 'default' }], ['priority', {}], ['default', { 'x-ebb-service-tier': 'priority' }]] as const) {
      const queued = mark + pending.length;
      pending.push(completion(frontend, { service_tier: tier }, headers));
      await events(frontend, 'request_queued', 1, queued);
    }
    const queuedAt = frontend.mark();
    assert.equal((await call('POST', `${w.systemUrl}/engine/resume`)).body.state, 'serving');
    assert.deepEqual(await admissions(frontend, 6, queuedAt, 'tier'), ['priority', 'priority', 'default', 'default', 'flex', 'flex']);
    assert.deepEqual((await Promise.all(pending)).map((r) => r.status), [200, 200, 200, 200, 200, 200]);
  });

  it("a flooding tenant does not starve a trickling one: each tenant's requests take turns", async () => {
    const { frontend, w } = await drainedFleet();
    const mark = frontend.mark();
    const pending: Array<Promise<Response>> = [];
    // The flood is queued first: first come, first served would admit all 8 of it before the trickle.
    for (let i = 0; i < 8; i++) pending.push(completion(frontend, {}, { 'x-ebb-tenant': 'flood' }));
    await events(frontend, 'request_queued', 8, mark);
    for (let i = 0; i < 2; i++) pending.push(completion(frontend, {}, { 'x-ebb-tenant': 'trickle' }));
    await events(frontend, 'request_queued', 10, mark);
    const queuedAt = frontend.mark();
    assert.equal((await call('POST', `${w.systemUrl}/engine/resume`)).body.state, 'serving');
    const order = await admissions(frontend, 10, queuedAt, 'tenant');
    assert.deepEqual(order.slice(0, 4).sort(), ['flood', 'flood', 'trickle', 'trickle'], `turns taken: ${order.join(' ')}`);
    assert.ok((await Promise.all(pending)).every((r) => r.status === 200));
  });

  it("a tenant's share is weighed in the tokens its requests ask for: one long request is worth many short ones", async () => {
    const { frontend, w } = await drainedFleet();
    const mark = frontend.mark();
    const pending: Array<Promise<Response>> = [];
    for (let i = 0; i < 2; i++) pending.push(completion(frontend, { max_tokens: 1000 }, { 'x-ebb-tenant': 'heavy' }));
    await events(frontend, 'request_queued', 2, mark);
    for (let i = 0; i < 4; i++) pending.push(completion(frontend, { max_tokens: 2 }, { 'x-ebb-tenant': 'light' }));
    await events(frontend, 'request_queued', 6, mark);
    const queuedAt = frontend.mark();
    assert.equal((await call('POST', `${w.systemUrl}/engine/resume`)).body.state, 'serving');
    const order = await admissions(frontend, 6, queuedAt, 'tenant');
    // heavy's first request asks for 1001 tokens; light's four for 3 each: they all fit in heavy's share before its second.
    assert.deepEqual(order, ['heavy', 'light', 'light', 'light', 'light', 'heavy'], `turns taken: ${order.join(' ')}`);
    assert.ok((await Promise.all(pending)).every((r) => r.status === 200));
  });

  it('requests that left without being served are not charged: a tenant whose burst left is not put behind another', async () => {
    const { frontend, w } = await drainedFleet();
    let mark = frontend.mark();
    // c keeps the queue busy throughout; a's burst leaves unserved.
    const pending = [completion(frontend, {}, { 'x-ebb-tenant': 'c' })];
    await events(frontend, 'request_queued', 1, mark);
    const leaving = Array.from({ length: 10 }, () => new AbortController());
    const burst = leaving.map((c) => completion(frontend, {}, { 'x-ebb-tenant': 'a' }, c.signal).catch(() => undefined));
    await events(frontend, 'request_queued', 11, mark);
    const leftAt = frontend.mark();
    for (const c of leaving) c.abort();
    await Promise.all(burst);
    await events(frontend, 'request_dequeued', 10, leftAt, (l) => l.outcome === 'left');
    mark = frontend.mark();
    for (let i = 0; i < 10; i++) pending.push(completion(frontend, {}, { 'x-ebb-tenant': 'b' }));
    await events(frontend, 'request_queued', 10, mark);
    pending.push(completion(frontend, {}, { 'x-ebb-tenant': 'a' }));
    await events(frontend, 'request_queued', 11, mark);
    const queuedAt = frontend.mark();
    assert.equal((await call('POST', `${w.systemUrl}/engine/resume`)).body.state, 'serving');
    const order = await admissions(frontend, 12, queuedAt, 'tenant');
    assert.deepEqual(order.slice(0, 3), ['c', 'b', 'a'], `a takes its turn among the first, not after b's ten: ${order.join(' ')}`);
    assert.ok((await Promise.all(pending)).every((r) => r.status === 200));
  });
});

describe('admission queue: tenants', () => {
  it("with --api-key-file the tenant is the key's name, whatever x-ebb-tenant says", async () => {
    const keys = join(mkdtempSync(join(tmpdir(), 'ebb-keys-')), 'api-keys');
    writeFileSync(keys, 'team-a:sk-ebb-a\nteam-b:sk-ebb-b\n', { mode: 0o600 });
    const { frontend, w } = await drainedFleet(['--api-key-file', keys]);
    const mark = frontend.mark();
    const pending = completion(frontend, {}, { authorization: 'Bearer sk-ebb-b', 'x-ebb-tenant': 'team-a' });
    const queued = await events(frontend, 'request_queued', 1, mark);
    assert.equal(queued.tenant, 'team-b');
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_queue_depth', 'model="m1",tier="default",tenant="team-b"'), 1);
    assert.equal((await call('POST', `${w.systemUrl}/engine/resume`)).body.state, 'serving');
    assert.equal((await pending).status, 200);
  });
});

describe('admission queue: saturation is the worker\'s own word', () => {
  it('two frontends do not over-admit one small worker: its refusals wait in the queues, and its own status admits them', async () => {
    const discovery = tempDiscoveryUrl();
    // One sequence at a time, one queued: a third is refused with worker_overloaded.
    const w = await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-batch-slots', '1', '--mocker-max-queue', '1', '--mocker-itl-ms', '20']);
    started.push(w);
    const [a, b] = [await startFrontend(discovery), await startFrontend(discovery, ['--queue-timeout', '20000'])];
    started.push(a!, b!);
    for (const f of [a!, b!]) await frontendSeesWorkers(f, 1);
    // A fills the worker: its third request is refused and waits in A's queue.
    let mark = a!.mark();
    const fromA = [0, 1, 2].map(() => completion(a!, { max_tokens: 40 }));
    await events(a!, 'request_queued', 1, mark);
    // B has nothing on the worker: no request of its own ends to wake its queue; only the worker's word can.
    mark = b!.mark();
    const fromB = [0, 1].map(() => completion(b!, { max_tokens: 5 }));
    await events(b!, 'request_queued', 1, mark);
    const answers = await Promise.all([...fromA, ...fromB]);
    assert.deepEqual(answers.map((r) => r.status), [200, 200, 200, 200, 200], 'every request served, no refusal surfaced');
    const refusals = await metricValue(w.systemUrl, 'ebb_worker_admission_refusals_total', 'code="worker_overloaded"');
    assert.ok(refusals >= 2, 'the worker refused what it could not take, from both frontends');
  });
});
