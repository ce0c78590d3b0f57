import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { call, fakeWorker, injectRecord, json, type FakeWorker } from './helpers/http.js';
import { bounded, frontendSeesWorkers, metricValue, startFleet, startFrontend, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type LogLine } from './helpers/processes.js';

/**
 * The admission queue's waiters (issue 42): one a worker cannot take does not hold the others'
 * turn, a change while one tries is not lost, a client that left leaves the queue at once, and a
 * worker that says it is full gets nothing until it says it has room.
 */
const started: EbbProcess[] = [];
const fakes: FakeWorker[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
  await Promise.all(fakes.map((f) => f.close()));
});

/** Far longer than any case: a stream that runs until the test aborts it. */
const ENDLESS = 100_000;

const completion = (frontend: FrontendHandle, extra: Record<string, unknown> = {}, signal?: AbortSignal) =>
  fetch(`${frontend.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'm1', prompt: 'x', max_tokens: 2, ...extra }), signal });

/** Resolves once the frontend has logged `count` lines with `event` after `from`. */
function events(frontend: EbbProcess, event: string, count: number, from: number, pred: (l: LogLine) => boolean = () => true): Promise<LogLine> {
  let seen = 0;
  return frontend.waitForLog((l) => l.event === event && pred(l) && ++seen === count, `${count} ${event} log line(s)`, { after: from });
}

/** A stream through the frontend, once its first bytes came: the reader, and how to end it. */
async function openStream(frontend: FrontendHandle, extra: Record<string, unknown>) {
  const controller = new AbortController();
  const res = await completion(frontend, { stream: true, max_tokens: ENDLESS, ...extra }, controller.signal);
  assert.equal(res.status, 200);
  const reader = res.body!.getReader();
  await reader.read();
  return {
    end: async () => {
      controller.abort();
      await reader.closed.catch(() => undefined);
    },
  };
}

function later<T = void>() {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

const OVERLOADED = { error: { code: 'worker_overloaded', message: 'full', type: 'service_unavailable', retryable: true } };
const TOKEN = JSON.stringify({ text: 'a' }) + '\n';
const DONE = JSON.stringify({ done: true, finish_reason: 'length', usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } }) + '\n';

/**
 * A worker the test scripts (over real sockets): /generate calls answered by `answer` in the order
 * they come, its status stream (GET /engine/status/events) sending what the test says, /live 200.
 */
async function scriptedWorker(discovery: string, id: string, answer: (n: number, res: ServerResponse) => void) {
  let status: ServerResponse | undefined;
  const statusOpen = later();
  const calls: Array<ReturnType<typeof later<void>>> = [];
  const arrived = (n: number) => (calls[n] ??= later()).promise;
  let count = 0;
  const fake = await fakeWorker((req, res) => {
    if (req.url === '/live') return json(res, 200, { status: 'ok' });
    if (req.url === '/engine/status/events') {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      status = res;
      say({ overloaded: true });
      statusOpen.resolve();
      return;
    }
    if (req.url !== '/generate') return json(res, 404, {});
    const n = count++;
    (calls[n] ??= later()).resolve();
    answer(n, res);
  });
  fakes.push(fake);
  const say = (s: { overloaded: boolean }) => status?.write(`event: status\ndata: ${JSON.stringify({ worker_id: id, state: 'serving', admission_open: true, ...s })}\n\n`);
  injectRecord(discovery, { worker_id: id, model: 'm1', request_url: fake.url, system_url: fake.url });
  return { fake, say, statusOpen: statusOpen.promise, arrived, calls: () => count };
}

describe('admission queue: a waiter no worker can take holds no turn', () => {
  it("a request whose adapter's slot is busy waits without blocking the base model's requests behind it", async () => {
    // One adapter slot, held by a1's endless stream: a2 cannot be taken until it ends; the base model can, beside it.
    const lora = ['--mocker-lora', 'a1', '--mocker-lora', 'a2', '--mocker-lora-slots', '1', '--mocker-batch-slots', '8', '--mocker-itl-ms', '20'];
    const { frontend, workers } = await startFleet(1, lora, ['--queue-timeout', '10000', '--resume-grace-ms', '0']);
    started.push(frontend, ...workers);
    const a1 = await openStream(frontend, { model: 'a1' });
    const mark = frontend.mark();
    const a2 = completion(frontend, { model: 'a2' });
    await events(frontend, 'request_queued', 1, mark);
    const base = [0, 1, 2].map(() => completion(frontend));
    const answers = await Promise.all(base);
    assert.deepEqual(
      answers.map((r) => r.status),
      [200, 200, 200],
      'the base requests are served while a2 waits for its slot (was: 429 at the queue timeout, behind a2)',
    );
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_queue_depth', 'model="m1",tier="default",tenant="anonymous"'), 1, 'a2 still waits');
    await a1.end();
    assert.equal((await a2).status, 200, "a2 is served once a1's stream freed the slot");
  });

  it("a request waiting at one frontend for an adapter's slot is woken when a stream at another frontend frees it", async () => {
    // The slot frees on the worker, not at the waiter's frontend (which sees no stream of its own end):
    // only the worker's word can wake it. Before, it slept to its queue timeout (429).
    const lora = ['--mocker-lora', 'a1', '--mocker-lora', 'a2', '--mocker-lora-slots', '1', '--mocker-itl-ms', '20'];
    const { discovery, frontend, workers } = await startFleet(1, lora, ['--resume-grace-ms', '0']);
    started.push(frontend, ...workers);
    const other = await startFrontend(discovery, ['--queue-timeout', '30000', '--resume-grace-ms', '0']);
    started.push(other);
    await frontendSeesWorkers(other, 1);
    const a1 = await openStream(frontend, { model: 'a1' });
    const mark = other.mark();
    const a2 = completion(other, { model: 'a2' });
    await events(other, 'request_queued', 1, mark);
    await a1.end();
    const res = await a2;
    assert.equal(res.status, 200, `a2 is served once a1's stream (at the other frontend) freed the slot: ${res.status} ${await res.clone().text()}`);
  });
});

describe('admission queue: no lost wake-up', () => {
  it('a slot freed while the only waiter is trying: refused by the worker as it was full, the waiter tries again at once', async () => {
    const discovery = tempDiscoveryUrl();
    const stream = later<ServerResponse>();
    const refusal = later<ServerResponse>();
    // 0: a stream the test ends; 1: the request's first try, refused (full); 2: its turn, answered
    // by the test; then a stream that ends at once.
    const w = await scriptedWorker(discovery, 'fake-1', (n, res) => {
      if (n === 1) return json(res, 503, OVERLOADED);
      if (n === 2) return refusal.resolve(res);
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      if (n === 0) {
        res.write(TOKEN);
        stream.resolve(res);
      } else res.end(TOKEN + DONE);
    });
    const frontend = await startFrontend(discovery, ['--queue-timeout', '10000']);
    started.push(frontend);
    await frontend.waitForEvent('discovery_reset');
    const running = await completion(frontend, { stream: true, max_tokens: 10 });
    const reader = running.body!.getReader();
    await reader.read();
    const mark = frontend.mark();
    const waiting = completion(frontend);
    await events(frontend, 'request_queued', 1, mark);
    await bounded(w.statusOpen, 'the frontend to follow the worker that refused (its status stream)');
    // The worker says it has room: the waiter's turn, which the worker keeps waiting.
    w.say({ overloaded: false });
    await bounded(w.arrived(2), "the waiter's try on the worker");
    // The running stream ends meanwhile (a slot freed): the change comes while the waiter is trying.
    (await stream.promise).end(DONE);
    while (!(await reader.read()).done);
    // The worker answers the try it got before: full.
    json(await refusal.promise, 503, OVERLOADED);
    const res = await waiting;
    assert.equal(res.status, 200, `tried again at once, not left asleep until its queue timeout: ${res.status} ${await res.clone().text()}`);
    assert.equal(w.calls(), 4, 'one more try, on the worker that freed a slot');
  });
});

describe('admission queue: a client that left leaves the queue', () => {
  it('queued streams whose clients left leave at once (their places go to live clients) and are never generated', async () => {
    // A long resume grace: a kept stream outlives its client by it, but one still queued has produced nothing to resume.
    const { frontend, workers } = await startFleet(1, ['--mocker-itl-ms', '2'], ['--queue-depth', '4', '--resume-grace-ms', '60000']);
    started.push(frontend, ...workers);
    const w = workers[0]!;
    let mark = frontend.mark();
    assert.equal((await call('POST', `${w.systemUrl}/engine/drain`)).body.state, 'drained');
    await frontend.waitForEvent('worker_removed', (l) => l.worker_id === w.workerId, { after: mark });
    mark = frontend.mark();
    const leaving = [0, 1, 2, 3].map(() => new AbortController());
    const gone = leaving.map((c) => completion(frontend, { stream: true }, c.signal).catch(() => undefined));
    await events(frontend, 'request_queued', 4, mark);
    mark = frontend.mark();
    for (const c of leaving) c.abort();
    await Promise.all(gone);
    await events(frontend, 'request_dequeued', 4, mark, (l) => l.outcome === 'left');
    const live = completion(frontend, { stream: true });
    await events(frontend, 'request_queued', 1, mark);
    assert.equal((await call('POST', `${w.systemUrl}/engine/resume`)).body.state, 'serving');
    const res = await live;
    assert.equal(res.status, 200, 'the live client took a freed place');
    assert.match(await res.text(), /data: \[DONE\]/);
    assert.equal(await metricValue(w.systemUrl, 'ebb_worker_admitted_total'), 1, 'only the live request was generated');
  });
});

describe("admission queue: a worker's word that it is full holds it out", () => {
  it('while its status says overloaded, queued requests are not sent to it; its word that it has room sends them', async () => {
    const discovery = tempDiscoveryUrl();
    // 0: refused (full); every later call served.
    const w = await scriptedWorker(discovery, 'fake-2', (n, res) => {
      if (n === 0) return json(res, 503, OVERLOADED);
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.end(TOKEN + DONE);
    });
    const frontend = await startFrontend(discovery);
    started.push(frontend);
    await frontend.waitForEvent('discovery_reset');
    // A refusal makes the frontend follow the worker's status; its room admits the waiter.
    let mark = frontend.mark();
    const first = completion(frontend);
    await events(frontend, 'request_queued', 1, mark);
    await bounded(w.statusOpen, 'the frontend to follow the worker that refused (its status stream)');
    w.say({ overloaded: false });
    assert.equal((await first).status, 200);
    // Now full by the worker's own word (another frontend's load): the next request waits for its room.
    mark = frontend.mark();
    w.say({ overloaded: true });
    await events(frontend, 'worker_full', 1, mark, (l) => l.worker_id === 'fake-2');
    const calls = w.calls();
    const second = completion(frontend);
    await events(frontend, 'request_queued', 1, mark);
    assert.equal(w.calls(), calls, 'nothing was sent to a worker that says it is full');
    w.say({ overloaded: false });
    assert.equal((await second).status, 200, 'its room admitted the queued request');
    assert.equal(w.calls(), calls + 1);
  });
});
