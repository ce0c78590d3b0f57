import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { call, fakeWorker, injectRecord } from './helpers/http.js';
import { drainOneUnderLoad } from './helpers/load.js';
import { startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type WorkerHandle } from './helpers/processes.js';
import { streamCompletion } from './helpers/sse.js';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

async function cluster(workers: number, workerArgs: string[] = [], model = 'm1') {
  const discovery = tempDiscoveryUrl();
  const ws: WorkerHandle[] = [];
  for (let i = 0; i < workers; i++) {
    const w = await startWorker(['--discovery', discovery, '--model', model, ...workerArgs]);
    started.push(w);
    ws.push(w);
  }
  // No admission queue: these tests read the answers a frontend gives at once (admission-queue.test.ts has the queue's).
  const frontend = await startFrontend(discovery, ['--queue-timeout', '0']);
  started.push(frontend);
  return { discovery, workers: ws, frontend };
}

/**
 * One fleet (3 workers, 1 frontend) shared by every test that leaves it as it found it: serving,
 * nothing in flight. Tests that kill or stop a process of their own, or need other flags, start
 * their own frontend on its discovery, or their own fleet.
 */
let shared: ReturnType<typeof cluster> | undefined;
const sharedFleet = () => (shared ??= cluster(3, ['--mocker-itl-ms', '3', '--mocker-ttft-ms', '5']));

describe('frontend: every answer names its request (x-request-id)', () => {
  it("carries one on streams, JSON answers and errors; a caller's own is kept, a malformed one replaced", async () => {
    const { frontend } = await sharedFleet();
    const chat = { model: 'm1', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 };
    const ids: string[] = [];
    for (const [body, status] of [[chat, 200], [{ ...chat, stream: true }, 200], [{ ...chat, model: 'nope' }, 404]] as const) {
      const res = await fetch(`${frontend.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
      await res.text();
      assert.equal(res.status, status);
      const id = res.headers.get('x-request-id') ?? '';
      assert.match(id, /^req_[0-9a-f]{32}$/, `x-request-id of a ${status}`);
      ids.push(id);
    }
    assert.equal(new Set(ids).size, ids.length, 'each request its own id');
    const kept = await fetch(`${frontend.url}/v1/models`, { headers: { 'x-request-id': 'gw-1234.abc' } });
    assert.equal(kept.headers.get('x-request-id'), 'gw-1234.abc');
    const replaced = await fetch(`${frontend.url}/v1/models`, { headers: { 'x-request-id': 'two words' } });
    assert.match(replaced.headers.get('x-request-id') ?? '', /^req_/);
  });
});

describe('frontend: OpenAI API through the official SDK', () => {
  it('streams and non-streams chat and completions', async () => {
    const { frontend } = await sharedFleet();
    const client = new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'unused' });

    const models = await client.models.list();
    assert.deepEqual(models.data.map((m) => m.id), ['m1']);

    const chat = await client.chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'Say hello' }], max_tokens: 7, seed: 3 });
    assert.equal(chat.object, 'chat.completion');
    assert.equal(chat.choices[0]?.message.role, 'assistant');
    assert.ok((chat.choices[0]?.message.content ?? '').length > 0);
    assert.equal(chat.usage?.completion_tokens, 7);

    const stream = await client.chat.completions.create({
      model: 'm1',
      messages: [{ role: 'user', content: 'Say hello' }],
      max_tokens: 7,
      seed: 3,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let finish: string | null | undefined;
    let usage: OpenAI.CompletionUsage | undefined | null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
      usage = chunk.usage ?? usage;
    }
    assert.equal(text, chat.choices[0]?.message.content, 'same seed, same text, streamed or not');
    assert.equal(finish, 'length');
    assert.equal(usage?.completion_tokens, 7);

    const completion = await client.completions.create({ model: 'm1', prompt: 'Once upon a time', max_tokens: 5 });
    assert.equal(completion.object, 'text_completion');
    assert.equal(completion.usage?.completion_tokens, 5);
    const completionStream = await client.completions.create({ model: 'm1', prompt: 'Once upon a time', max_tokens: 5, stream: true });
    let pieces = 0;
    for await (const chunk of completionStream) if (chunk.choices[0]?.text) pieces++;
    assert.equal(pieces, 5);

    await assert.rejects(client.chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'x' }] }), (err: unknown) => {
      assert.ok(err instanceof OpenAI.NotFoundError);
      return true;
    });
    await assert.rejects(
      client.chat.completions.create({ model: 'm1', messages: [], max_tokens: 5 }),
      (err: unknown) => err instanceof OpenAI.BadRequestError,
    );
  });

  it('answers bad input with 400 in OpenAI error shape, and wrong methods with 405', async () => {
    const { frontend } = await sharedFleet();
    const bad = await call('POST', `${frontend.url}/v1/chat/completions`, { model: 'm1', messages: 'hi' });
    assert.equal(bad.status, 400);
    assert.equal(bad.body.error.type, 'invalid_request_error');
    assert.equal(typeof bad.body.error.message, 'string');
    const stringly = await call('POST', `${frontend.url}/v1/completions`, { model: 'm1', prompt: 'x', stream: 'true' });
    assert.equal(stringly.status, 400, 'no type coercion: "true" is not a boolean');
    const badJson = await call('POST', `${frontend.url}/v1/completions`, '{"model":');
    assert.equal(badJson.status, 400);
    const wrong = await call('PUT', `${frontend.url}/v1/completions`);
    assert.equal(wrong.status, 405);
    assert.equal(wrong.headers.get('allow'), 'POST');
    assert.equal((await call('POST', `${frontend.url}/engine/drain`)).status, 404, 'no admin route on the public port');
  });

  it('answers 503 no_serving_worker when every worker of the model refuses (still listed, draining)', async () => {
    // Listed in discovery but refusing: what the frontend sees of a drained worker before discovery catches up.
    const { frontend, refusing, res } = await refusedByDraining({});
    assert.equal(res.status, 503);
    assert.equal(res.body.error.code, 'no_serving_worker');
    assert.equal(res.body.error.retryable, true);
    assert.equal(refusing.seen.length, 1, 'the refusal came from the worker');
    assert.equal(res.headers.get('retry-after'), '10', 'when the frontend tries the draining worker again (its hold)');
    const models = await call('GET', `${frontend.url}/v1/models`);
    assert.deepEqual(models.body.data.map((m: { id: string }) => m.id), ['m1'], 'a draining model is still a model');
  });
});

/**
 * A frontend without a queue whose model's one worker (listed in discovery) refuses every request
 * as a draining worker does, with `headers`; and that frontend's answer to a completion.
 */
async function refusedByDraining(headers: Record<string, string>) {
  const discovery = tempDiscoveryUrl();
  const refusing = await fakeWorker((_req, res) => {
    res.writeHead(503, { 'content-type': 'application/json', ...headers });
    res.end(JSON.stringify({ error: { code: 'worker_draining', message: 'draining', type: 'service_unavailable', retryable: true } }));
  });
  after(() => refusing.close());
  injectRecord(discovery, { worker_id: 'w-refusing', model: 'm1', request_url: refusing.url, system_url: refusing.url });
  const frontend = await startFrontend(discovery, ['--queue-timeout', '0']);
  started.push(frontend);
  await frontend.waitForEvent('discovery_reset', (l) => (l.workers as string[]).includes('w-refusing'));
  return { frontend, refusing, res: await call('POST', `${frontend.url}/v1/completions`, { model: 'm1', prompt: 'x' }) };
}

describe("frontend: a draining worker's ETA", () => {
  it("is the Retry-After of the 503 when every worker of the model refuses draining and says when its drain ends", async () => {
    const { res } = await refusedByDraining({ 'retry-after': '7' });
    assert.equal(res.status, 503);
    assert.equal(res.body.error.code, 'no_serving_worker');
    assert.equal(res.headers.get('retry-after'), '7', "the worker's drain ETA, not the frontend's 10 s hold");
  });
});

describe('frontend: a model whose workers are all out of rotation is still a model', () => {
  it('answers 503 no_serving_worker while every worker is drained (no queue), and 200 once one resumes; 404 only for a model nobody serves', async () => {
    const { frontend, workers } = await sharedFleet();
    const [w, ...others] = workers;
    const body = { model: 'm1', prompt: 'x', max_tokens: 2 };
    assert.equal((await call('POST', `${frontend.url}/v1/completions`, body)).status, 200);
    const beforeDrain = frontend.mark();
    for (const x of workers) assert.equal((await call('POST', `${x.systemUrl}/engine/drain`)).body.state, 'drained');
    for (const x of workers) await frontend.waitForEvent('worker_removed', (l) => l.worker_id === x.workerId, { after: beforeDrain });
    const refused = await call('POST', `${frontend.url}/v1/completions`, body);
    assert.equal(refused.status, 503);
    assert.equal(refused.body.error.code, 'no_serving_worker');
    assert.equal(refused.headers.get('retry-after'), null, 'nothing known of when one comes back: no guess');
    assert.equal((await call('POST', `${frontend.url}/v1/completions`, { ...body, model: 'nobody' })).status, 404);
    // /v1/models agrees with the 503: the model is listed (unavailable), not missing.
    const listed = (await call('GET', `${frontend.url}/v1/models`)).body.data;
    assert.deepEqual(listed.map((m: { id: string; status: string }) => [m.id, m.status]), [['m1', 'unavailable']]);
    const one = await call('GET', `${frontend.url}/v1/models/m1`);
    assert.equal(one.status, 200);
    assert.equal(one.body.status, 'unavailable');
    assert.equal((await call('GET', `${frontend.url}/v1/models/nobody`)).status, 404);
    const beforeResume = frontend.mark();
    assert.equal((await call('POST', `${w!.systemUrl}/engine/resume`)).body.state, 'serving');
    await frontend.waitForEvent('worker_added', (l) => l.worker_id === w!.workerId, { after: beforeResume });
    assert.equal((await call('POST', `${frontend.url}/v1/completions`, body)).status, 200);
    assert.deepEqual((await call('GET', `${frontend.url}/v1/models`)).body.data.map((m: { id: string; status: string }) => [m.id, m.status]), [['m1', 'available']]);
    // Back as it was, for the tests that share the fleet.
    for (const x of others) assert.equal((await call('POST', `${x.systemUrl}/engine/resume`)).body.state, 'serving');
    for (const x of others) await frontend.waitForEvent('worker_added', (l) => l.worker_id === x.workerId, { after: beforeResume });
  });
});

describe('frontend: hung worker', () => {
  it('moves requests off a worker that accepts connections but never answers (SIGSTOP)', async () => {
    const { discovery, workers } = await sharedFleet();
    const hung = workers[0]!;
    // Past any stall of a healthy worker on a loaded machine, so only the hung one times out.
    const frontend = await startFrontend(discovery, ['--upstream-headers-timeout-ms', '2000']);
    started.push(frontend);
    hung.signal('SIGSTOP');
    try {
      // More requests than healthy workers: least-loaded routing sends some to the hung one.
      const results = await Promise.all([0, 1, 2, 3, 4, 5].map((i) => streamCompletion(frontend.url, { model: 'm1', max_tokens: 3, seed: i })));
      for (const r of results) {
        assert.equal(r.status, 200, r.error);
        assert.equal(r.tokens, 3);
        assert.notEqual(r.workerId, hung.workerId);
      }
    } finally {
      hung.signal('SIGCONT');
    }
    await frontend.stop();
  });
});

describe('frontend: SIGTERM', () => {
  it('lets open streams finish, then exits 0', async () => {
    const frontend = await startFrontend((await sharedFleet()).discovery, ['--shutdown-grace-ms', '0']);
    started.push(frontend);
    let began!: () => void;
    const first = new Promise<void>((r) => (began = r));
    // ~1.2 s of tokens (itl 3 ms): still streaming when SIGTERM lands.
    const stream = streamCompletion(frontend.url, { model: 'm1', max_tokens: 400 }, () => began());
    await first;
    frontend.signal('SIGTERM');
    await frontend.waitForEvent('frontend_stopping');
    const done = await stream;
    assert.equal(done.tokens, 400, done.error);
    assert.equal(done.done, true);
    assert.equal(await frontend.exitCode(), 0);
  });

  it('cuts streams still open at --shutdown-timeout-ms and exits 1, instead of hanging', async () => {
    const frontend = await startFrontend((await sharedFleet()).discovery, ['--shutdown-timeout-ms', '300', '--shutdown-grace-ms', '0']);
    started.push(frontend);
    let began!: () => void;
    const first = new Promise<void>((r) => (began = r));
    const stream = streamCompletion(frontend.url, { model: 'm1', max_tokens: 100_000 }, () => began());
    await first;
    frontend.signal('SIGTERM');
    assert.equal(await frontend.exitCode(), 1);
    await frontend.waitForEvent('shutdown_deadline');
    const cut = await stream;
    assert.equal(cut.done, false);
    assert.ok(cut.tokens > 0 && cut.tokens < 100_000);
  });
});

describe('frontend: zero dropped requests', () => {
  it('drains one of 3 workers mid-load: every request completes, none reach it after drain returns, resume brings it back', async () => {
    const { frontend, workers } = await sharedFleet();
    await drainOneUnderLoad(frontend, workers[1]!);
  });

  it('retries requests queued on a worker killed with SIGKILL; none that had no token yet fails', async () => {
    const { frontend, workers } = await cluster(2, ['--mocker-itl-ms', '30', '--mocker-batch-slots', '2']);
    const [victim] = workers;
    let killed = false;
    const seenBeforeKill = new Set<number>();
    let fourRunning!: () => void;
    const running = new Promise<void>((resolve) => (fourRunning = resolve));
    const requests = Array.from({ length: 8 }, (_, i) =>
      streamCompletion(frontend.url, { model: 'm1', max_tokens: 40, seed: i }, () => {
        if (killed) return;
        seenBeforeKill.add(i);
        if (seenBeforeKill.size === 4) fourRunning();
      }),
    );
    // Each worker runs 2 and queues 2: wait until the 4 running ones have streamed a token.
    await running;
    killed = true;
    victim!.signal('SIGKILL');
    const results = await Promise.all(requests);
    const notStartedBeforeKill = results.filter((_, i) => !seenBeforeKill.has(i));
    assert.equal(notStartedBeforeKill.length, 4);
    for (const r of notStartedBeforeKill) {
      assert.equal(r.status, 200, r.error);
      assert.equal(r.tokens, 40, r.error);
      assert.equal(r.done, true);
    }
    // The streams the killed worker was serving moved to the other worker mid-stream.
    for (const [i, r] of results.entries()) {
      assert.equal(r.done, true, `stream ${i}: ${r.error}`);
      assert.equal(r.tokens, 40, `stream ${i}`);
    }
  });
});
