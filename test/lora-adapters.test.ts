import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { call, openLineStream } from './helpers/http.js';
import { bounded, frontendSeesWorkers, metricValue, startFrontend, startWorker, tempDiscoveryUrl, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { startEngineSim, type SimKind } from './helpers/engine-sim.js';

/**
 * LoRA adapters on mocker workers (issue 37): two workers that can load a1 and a2 (two slots each),
 * behind a frontend with the kv router. Every wait is on an event: a log line, a stream's end.
 */
let frontend: FrontendHandle;
let workers: WorkerHandle[];
const LORA = ['--mocker-lora', 'a1', '--mocker-lora', 'a2', '--mocker-lora-slots', '2', '--mocker-lora-load-ms', '100', '--mocker-ttft-ms', '0'];

before(async () => {
  const discovery = tempDiscoveryUrl();
  workers = await Promise.all([0, 1].map(() => startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '5', ...LORA])));
  frontend = await startFrontend(discovery, ['--router', 'kv']);
  await frontendSeesWorkers(frontend, 2);
});
after(async () => {
  await Promise.all([frontend, ...workers].map((p) => p.terminate()));
});

const client = () => new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'unused', maxRetries: 0 });
const byId = (id: string) => workers.find((w) => w.workerId === id)!;

/** Resolves once the frontend has the record of `workerId` in which `adapter` is `state` (null: not resident). */
function frontendSees(workerId: string, adapter: string, state: string | null) {
  return frontend.waitForLog(
    (l) => l.event === 'worker_added' && l.worker_id === workerId && ((l.adapters as Record<string, string> | undefined)?.[adapter] ?? null) === state,
    `the frontend to see ${adapter} ${state ?? 'not resident'} on ${workerId}`,
  );
}

async function complete(model: string, prompt: string, maxTokens = 8) {
  const r = await call('POST', `${frontend.url}/v1/completions`, { model, prompt, max_tokens: maxTokens, temperature: 0 });
  return { status: r.status, text: r.body?.choices?.[0]?.text as string | undefined, worker: r.headers.get('x-ebb-worker-id') ?? undefined, body: r.body };
}

describe('LoRA adapters (mocker)', () => {
  it('the openai SDK names an adapter as its model: a1, a2 and the base answer the same prompt differently at temperature 0', async () => {
    const c = client();
    const ask = async (model: string) => (await c.chat.completions.create({ model, messages: [{ role: 'user', content: 'tell me about tides' }], max_tokens: 8, temperature: 0 })).choices[0]?.message.content;
    const [base, a1, a2] = [await ask('m1'), await ask('a1'), await ask('a2')];
    assert.ok(base && a1 && a2, 'three answers');
    assert.notEqual(a1, base, 'a1 is not the base model');
    assert.notEqual(a2, base, 'a2 is not the base model');
    assert.notEqual(a1, a2, 'two adapters, two answers');
    assert.equal(await ask('a1'), a1, 'an adapter answers alike every time (temperature 0)');
    const chat = await c.chat.completions.create({ model: 'a1', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
    assert.equal(chat.model, 'a1', 'the answer names the model the client asked for');
  });

  it('/v1/models lists the adapters with their base model as parent; an unknown adapter 404s', async () => {
    const models = await client().models.list();
    const ids = models.data.map((m) => m.id);
    assert.deepEqual(ids, ['m1', 'a1', 'a2']);
    for (const m of models.data.slice(1)) assert.equal((m as unknown as { parent: string }).parent, 'm1');
    assert.equal(((await client().models.retrieve('a2')) as unknown as { parent: string }).parent, 'm1');
    await assert.rejects(client().chat.completions.create({ model: 'a9', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }), (err: unknown) => err instanceof OpenAI.NotFoundError);
    const r = await complete('a9', 'hi');
    assert.equal(r.status, 404);
    assert.equal(r.body.error.code, 'model_not_found');
  });

  it('embeddings naming an adapter: a 400 saying adapters do not embed, with the base model to ask', async () => {
    const r = await call('POST', `${frontend.url}/v1/embeddings`, { model: 'a1', input: 'tides' });
    assert.equal(r.status, 400, JSON.stringify(r.body));
    assert.equal(r.body.error.code, 'unsupported_parameter');
    assert.equal(r.body.error.param, 'model');
    assert.match(r.body.error.message, /"a1" is a LoRA adapter of "m1": adapters do not embed; ask "m1"/);
  });

  it('an adapter drain under load loses no request and unloads only once its last stream ended; its requests go to the other worker meanwhile', async () => {
    // a2 resident on one worker, seen so by the frontend: its requests go there.
    const first = await complete('a2', 'the river and the harbor');
    assert.equal(first.status, 200);
    const home = byId(first.worker!);
    const other = workers.find((w) => w !== home)!;
    await frontendSees(home.workerId, 'a2', 'serving');
    for (let i = 0; i < 3; i++) assert.equal((await complete('a2', `the river and the harbor ${i}`)).worker, home.workerId, 'the router prefers the worker where a2 is resident');

    // Four long streams of a2 on it, each past its first token.
    const streams = await Promise.all([0, 1, 2, 3].map((i) => openLineStream(`${frontend.url}/v1/completions`, { model: 'a2', prompt: `the river and the harbor ${i}`, max_tokens: 300, stream: true }, '\n\n')));
    await Promise.all(streams.map((s) => s.first));
    const unloaded = home.waitForNextEvent('adapter_state_changed', (l) => l.adapter === 'a2' && l.to === 'unloaded');
    const drained = await call('POST', `${home.systemUrl}/engine/adapters/a2/drain`, { reason: 'test' });
    assert.equal(drained.status, 202);
    assert.equal(drained.body.state, 'draining');
    assert.ok(drained.body.inflight_requests >= 1, `its streams are still running: ${JSON.stringify(drained.body)}`);
    const status = await call('GET', `${home.systemUrl}/engine/status`);
    assert.equal(status.body.adapters.find((a: { name: string }) => a.name === 'a2').state === 'unloaded' ? 'unloaded' : 'draining', 'draining');

    // Admission for a2 is closed there at once: a retryable refusal, before any work.
    const direct = await call('POST', `${home.requestUrl}/generate`, { model: 'm1', prompt: 'late', adapter: 'a2', max_tokens: 2, stream: false });
    assert.equal(direct.status, 503);
    assert.equal(direct.body.error.code, 'adapter_draining');
    assert.equal(direct.body.error.retryable, true);
    // Meanwhile a2's new requests are served, by the other worker (which loads it).
    await frontendSees(home.workerId, 'a2', 'draining');
    const during = await complete('a2', 'while it drains');
    assert.equal(during.status, 200);
    assert.equal(during.worker, other.workerId);

    // Every stream ends whole: no request lost.
    for (const s of streams) {
      const lines = await bounded(s.done, 'an a2 stream to end');
      assert.match(lines.at(-1) ?? '', /(^|\n)data: \[DONE\]$/);
      const chunks = lines.map((l) => l.split('\n').find((x) => x.startsWith('data: {'))).filter((d) => d !== undefined).map((d) => JSON.parse(d.slice(6)));
      assert.ok(!chunks.some((c) => c.error !== undefined), 'no error event');
      assert.equal(chunks.at(-1).choices[0].finish_reason, 'length');
    }
    const line = await bounded(unloaded, 'a2 to unload');
    assert.equal(line.from, 'draining');
    assert.equal(line.inflight, 0, 'unloaded with nothing in flight');
    const after = await call('GET', `${home.systemUrl}/engine/status`);
    assert.deepEqual(
      after.body.adapters.find((a: { name: string }) => a.name === 'a2'),
      { ...after.body.adapters.find((a: { name: string }) => a.name === 'a2'), state: 'unloaded', inflight_requests: 0 },
    );
    assert.equal(await metricValue(home.systemUrl, 'ebb_worker_adapter_inflight_requests', 'adapter="a2"'), 0);
  });

  it('a worker drain drains its adapters: the adapter is loaded on the other worker, the admin routes need the state table', async () => {
    const r = await complete('a1', 'quiet steady light');
    const home = byId(r.worker!);
    const other = workers.find((w) => w !== home)!;
    await frontendSees(home.workerId, 'a1', 'serving');
    const unloaded = home.waitForNextEvent('adapter_state_changed', (l) => l.adapter === 'a1' && l.to === 'unloaded');
    assert.equal((await call('POST', `${home.systemUrl}/engine/drain`, { reason: 'test' })).status < 300, true);
    await bounded(unloaded, 'a1 to unload with its worker drain');
    const moved = await complete('a1', 'quiet steady light');
    assert.equal(moved.status, 200);
    assert.equal(moved.worker, other.workerId);
    assert.equal(moved.text, r.text, 'the same adapter answers alike on either worker');
    assert.ok((await metricValue(other.systemUrl, 'ebb_worker_adapter_loads_total', 'adapter="a1"')) >= 1);
    const info = await fetch(`${other.systemUrl}/metrics`).then((x) => x.text());
    assert.match(info, /vllm:lora_requests_info\{running_lora_adapters="[^"]*",waiting_lora_adapters="",max_lora="2"\}/);
    // An admin load at run time (a new adapter, for the mocker): answered once resident; with both
    // slots taken by idle adapters, the least recently used one is evicted for it.
    const loaded = await call('POST', `${other.systemUrl}/engine/adapters/a3/load`, {});
    assert.equal(loaded.status, 200);
    assert.equal(loaded.body.state, 'serving');
    const states = (await call('GET', `${other.systemUrl}/engine/status`)).body.adapters.map((a: { name: string; state: string }) => `${a.name}:${a.state}`);
    assert.deepEqual(states, ['a1:serving', 'a2:unloaded', 'a3:serving'], 'a2, used before a1, was evicted');
    await frontendSees(other.workerId, 'a3', 'serving');
    assert.equal((await complete('a3', 'hello')).worker, other.workerId);
    assert.equal((await call('POST', `${home.systemUrl}/engine/resume`, {})).status, 200);
  });

  it('every slot holding an adapter with a request in flight: a request for a third is refused, retryably, before any work', async () => {
    // The worker that loaded a3 at run time (the test before): it knows three adapters, for two slots.
    const knows = await Promise.all(workers.map(async (x) => (await call('GET', `${x.systemUrl}/engine/status`)).body.adapters.some((a: { name: string }) => a.name === 'a3')));
    const w = workers[knows.indexOf(true)]!;
    const gen = (adapter: string, maxTokens: number) => ({ model: 'm1', prompt: 'hold the slot', adapter, max_tokens: maxTokens });
    const held = await Promise.all(['a1', 'a2'].map((a) => openLineStream(`${w.requestUrl}/generate`, gen(a, 300))));
    try {
      await Promise.all(held.map((h) => h.first));
      const refused = await call('POST', `${w.requestUrl}/generate`, { ...gen('a3', 2), stream: false });
      assert.equal(refused.status, 503);
      assert.equal(refused.body.error.code, 'adapter_slots_busy');
      assert.equal(refused.body.error.retryable, true);
    } finally {
      for (const h of held) h.abort();
    }
  });

  it('an admin load on the mocker: a new name, never a path, never the model\'s name', async () => {
    const w = workers[0]!;
    const withPath = await call('POST', `${w.systemUrl}/engine/adapters/a9/load`, { path: '/etc/passwd' });
    assert.equal(withPath.status, 400, JSON.stringify(withPath.body));
    assert.equal(withPath.body.error.param, 'path');
    const model = await call('POST', `${w.systemUrl}/engine/adapters/m1/load`, {});
    assert.equal(model.status, 400, JSON.stringify(model.body));
    assert.equal(model.body.error.param, 'name');
    const names = (await call('GET', `${w.systemUrl}/engine/status`)).body.adapters.map((a: { name: string }) => a.name);
    assert.ok(!names.includes('a9') && !names.includes('m1'), `nothing refused is offered: ${names}`);
  });

  it('an adapter draining with a request in flight still holds its slot: a request for a third waits for its unload', async () => {
    const knows = await Promise.all(workers.map(async (x) => (await call('GET', `${x.systemUrl}/engine/status`)).body.adapters.some((a: { name: string }) => a.name === 'a3')));
    const w = workers[knows.indexOf(true)]!;
    const gen = (adapter: string, maxTokens: number) => ({ model: 'm1', prompt: 'hold the slot', adapter, max_tokens: maxTokens });
    const [a1, a2] = await Promise.all(['a1', 'a2'].map((a) => openLineStream(`${w.requestUrl}/generate`, gen(a, 100_000))));
    try {
      await Promise.all([a1!.first, a2!.first]);
      const draining = await call('POST', `${w.systemUrl}/engine/adapters/a2/drain`, { reason: 'test' });
      assert.equal(draining.status, 202);
      assert.equal(draining.body.state, 'draining');
      assert.equal(draining.body.inflight_requests, 1);
      // Two slots: a1 serving, a2 draining; both hold theirs until their requests end.
      const refused = await call('POST', `${w.requestUrl}/generate`, { ...gen('a3', 2), stream: false });
      assert.equal(refused.status, 503, JSON.stringify(refused.body));
      assert.equal(refused.body.error.code, 'adapter_slots_busy');
      const unloaded = w.waitForNextEvent('adapter_state_changed', (l) => l.adapter === 'a2' && l.to === 'unloaded');
      a2!.abort();
      await bounded(unloaded, 'a2 to unload once its stream ended');
      assert.equal((await call('POST', `${w.requestUrl}/generate`, { ...gen('a3', 2), stream: false })).status, 200, 'a3 loads in the slot a2 freed');
    } finally {
      a1!.abort();
      a2!.abort();
    }
  });
});

describe('LoRA adapters (--engine openai)', () => {
  it('an evicted adapter whose unload fails: the load waiting for its slot fails at once (adapter_load_failed, retried elsewhere); the slot stays counted, and the next load that needs it retries the unload', async () => {
    const sim = await startEngineSim({ kind: 'vllm', itlMs: 1 });
    const worker = await startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'base', '--engine', 'openai', '--engine-url', sim.url, '--engine-kind', 'vllm', '--lora', 'x=/adapters/x', '--lora', 'y=/adapters/y', '--engine-max-loras', '1']);
    const gen = (adapter: string) => call('POST', `${worker.requestUrl}/generate`, { model: 'base', prompt: 'select', adapter, max_tokens: 2, stream: false });
    const states = async () => (await call('GET', `${worker.systemUrl}/engine/status`)).body.adapters.map((a: { name: string; state: string }) => `${a.name}:${a.state}`);
    try {
      assert.equal((await gen('x')).status, 200);
      sim.failUnloads.add('x');
      const refused = await bounded(gen('y'), 'the request for y, whose slot x could not free, to be answered');
      assert.equal(refused.status, 502, JSON.stringify(refused.body));
      assert.equal(refused.body.error.code, 'adapter_load_failed');
      assert.match(refused.body.error.message, /evicting x: unload failed: \/v1\/unload_lora_adapter answered 500/);
      assert.deepEqual(await states(), ['x:draining', 'y:unloaded'], 'x holds its slot (fail closed), y is not resident');
      // The next request for y retries x's unload (the engine still refuses): y is not loaded beside x.
      const again = await bounded(gen('y'), 'the second request for y to be answered');
      assert.equal(again.status, 502, JSON.stringify(again.body));
      assert.equal(again.body.error.code, 'adapter_load_failed');
      assert.equal(sim.seen.filter((r) => r.path === '/v1/unload_lora_adapter').length, 2, 'the unload was tried again');
      assert.deepEqual(sim.seen.filter((r) => r.path === '/v1/load_lora_adapter').map((r) => r.body.lora_name), ['x'], 'y was never loaded while x held the only slot');
      // The engine frees it again: the next request for y retries the unload, and y loads in the slot.
      sim.failUnloads.delete('x');
      assert.equal((await gen('y')).status, 200);
      assert.deepEqual(await states(), ['x:unloaded', 'y:serving']);
    } finally {
      await worker.terminate();
      await sim.close();
    }
  });

  it('an adapter whose unload failed gets its slot back from a worker drain and resume, each retrying the unload', async () => {
    const sim = await startEngineSim({ kind: 'vllm', itlMs: 1 });
    const worker = await startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'base', '--engine', 'openai', '--engine-url', sim.url, '--engine-kind', 'vllm', '--lora', 'x=/adapters/x', '--engine-max-loras', '1']);
    const gen = (adapter: string) => call('POST', `${worker.requestUrl}/generate`, { model: 'base', prompt: 'select', adapter, max_tokens: 2, stream: false });
    const unloads = () => sim.seen.filter((r) => r.path === '/v1/unload_lora_adapter').length;
    try {
      assert.equal((await gen('x')).status, 200);
      sim.failUnloads.add('x');
      let failed = worker.waitForNextEvent('adapter_unload_failed');
      assert.equal((await call('POST', `${worker.systemUrl}/engine/adapters/x/unload`, {})).status, 202);
      await bounded(failed, 'the admin unload of x to fail');
      // A worker drain retries it (the engine still refuses), its resume again (the engine lets go).
      failed = worker.waitForNextEvent('adapter_unload_failed');
      assert.equal((await call('POST', `${worker.systemUrl}/engine/drain`, {})).status < 300, true);
      await bounded(failed, 'the worker drain to retry the unload of x');
      assert.equal(unloads(), 2);
      sim.failUnloads.delete('x');
      const unloaded = worker.waitForNextEvent('adapter_state_changed', (l) => l.adapter === 'x' && l.to === 'unloaded');
      assert.equal((await call('POST', `${worker.systemUrl}/engine/resume`, {})).status, 200);
      await bounded(unloaded, 'the resume to retry the unload of x');
      assert.equal(unloads(), 3);
      assert.equal((await gen('x')).status, 200, 'x loads again in its slot');
    } finally {
      await worker.terminate();
      await sim.close();
    }
  });

  it('an admin load on a worker without an admin token reads only the paths the operator gave: the adapter\'s own, or one under --lora-dir', async () => {
    const sim = await startEngineSim({ kind: 'vllm', itlMs: 1 });
    const start = (extra: string[]) =>
      startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'base', '--engine', 'openai', '--engine-url', sim.url, '--engine-kind', 'vllm', '--lora', 'x=/adapters/x', '--engine-max-loras', '4', ...extra]);
    const workers: WorkerHandle[] = [];
    const load = (w: WorkerHandle, name: string, body: Record<string, unknown> = {}) => call('POST', `${w.systemUrl}/engine/adapters/${encodeURIComponent(name)}/load`, body);
    const loaded = () => sim.seen.filter((r) => r.path === '/v1/load_lora_adapter').map((r) => r.body.lora_path);
    try {
      const withDir = await start(['--lora-dir', '/adapters/extra']);
      workers.push(withDir);
      const without = await start([]);
      workers.push(without);
      assert.equal((await load(withDir, 'x')).status, 200, 'a --lora adapter, from its own path');
      assert.equal((await load(withDir, 'y', { path: '/adapters/extra/y' })).status, 200, 'a new one under --lora-dir');
      for (const path of ['/etc/passwd', '/adapters/x', '/adapters/extra/../../etc/passwd', 'org/hub-model', '/adapters/extra']) {
        const refused = await load(withDir, 'z', { path });
        assert.equal(refused.status, 403, `${path}: ${JSON.stringify(refused.body)}`);
        assert.equal(refused.body.error.code, 'forbidden');
      }
      const pathless = await load(withDir, 'z');
      assert.equal(pathless.status, 400, JSON.stringify(pathless.body));
      assert.equal(pathless.body.error.param, 'path', 'a new adapter names its path');
      const model = await load(withDir, 'base');
      assert.equal(model.status, 400, JSON.stringify(model.body));
      assert.equal(model.body.error.param, 'name', "the model's own name");
      const other = await load(withDir, 'x', { path: '/tmp/x' });
      assert.equal(other.status, 403, 'a --lora adapter from another path');
      const noDir = await load(without, 'y', { path: '/adapters/extra/y' });
      assert.equal(noDir.status, 403);
      assert.match(noDir.body.error.message, /under a --lora-dir \(this worker has none\)/);
      assert.deepEqual(loaded(), ['/adapters/x', '/adapters/extra/y'], 'the engine was asked to read nothing else');
      const names = (await call('GET', `${withDir.systemUrl}/engine/status`)).body.adapters.map((a: { name: string }) => a.name);
      assert.deepEqual(names, ['x', 'y'], 'no refused name is offered');
    } finally {
      await Promise.all(workers.map((w) => w.terminate()));
      await sim.close();
    }
  });

  for (const [kind, load, unload] of [
    ['vllm', '/v1/load_lora_adapter', '/v1/unload_lora_adapter'],
    ['sglang', '/load_lora_adapter', '/unload_lora_adapter'],
  ] as Array<[SimKind, string, string]>)
    it(`${kind}: a request for an adapter loads it through the engine's runtime endpoint, names it there, and a drain unloads it`, async () => {
      const sim = await startEngineSim({ kind, itlMs: 1 });
      sim.loras.set('pre', '/adapters/pre'); // loaded before the worker started: read back from its /v1/models
      const discovery = tempDiscoveryUrl();
      const worker = await startWorker(['--discovery', discovery, '--model', 'base', '--engine', 'openai', '--engine-url', sim.url, '--engine-kind', kind, '--lora', 'sql=/adapters/sql', '--engine-max-loras', '1']);
      // No admission queue: the drained worker's adapter is answered at once (a queue would wait for its resume).
      const fe = await startFrontend(discovery, ['--queue-timeout', '0']);
      try {
        await frontendSeesWorkers(fe, 1);
        const before = (await call('GET', `${worker.systemUrl}/engine/status`)).body.adapters.map((a: { name: string; state: string }) => `${a.name}:${a.state}`);
        assert.deepEqual(before, ['sql:unloaded', 'pre:serving']);
        const r = await call('POST', `${fe.url}/v1/completions`, { model: 'sql', prompt: 'select', max_tokens: 3 });
        assert.equal(r.status, 200, JSON.stringify(r.body));
        assert.deepEqual(sim.seen.filter((x) => x.path === load).map((x) => x.body), [{ lora_name: 'sql', lora_path: '/adapters/sql' }]);
        const generated = sim.seen.find((x) => x.path === '/v1/completions')!.body;
        if (kind === 'vllm') assert.equal(generated.model, 'sql', 'vLLM: the adapter is the model');
        else assert.equal(generated.lora_path, 'sql', 'SGLang: the adapter is lora_path');
        assert.deepEqual([...sim.loras.keys()], ['sql']);
        const drained = await call('POST', `${worker.systemUrl}/engine/adapters/sql/unload`, {});
        assert.ok(drained.status === 200 || drained.status === 202);
        await bounded(worker.waitForEvent('adapter_state_changed', (l) => l.adapter === 'sql' && l.to === 'unloaded'), 'sql to unload');
        // One slot (--engine-max-loras 1): pre, idle, was evicted for sql, then sql unloaded.
        assert.deepEqual(sim.seen.filter((x) => x.path === unload).map((x) => x.body), [{ lora_name: 'pre' }, { lora_name: 'sql' }]);
        assert.deepEqual([...sim.loras.keys()], [], 'the engine holds it no more');
        // Its only worker drained: the adapter is known, not served: a retryable 503, not a 404.
        const gone = fe.waitForNextEvent('worker_removed');
        await call('POST', `${worker.systemUrl}/engine/drain`, {});
        await bounded(gone, 'the frontend to see the worker leave');
        const refused = await call('POST', `${fe.url}/v1/completions`, { model: 'sql', prompt: 'select', max_tokens: 3 });
        assert.equal(refused.status, 503);
        assert.equal(refused.body.error.code, 'no_serving_worker');
      } finally {
        await Promise.all([fe.terminate(), worker.terminate()]);
        await sim.close();
      }
    });
});
