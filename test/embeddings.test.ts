/**
 * POST /v1/embeddings through the openai SDK against a real frontend and real workers of every
 * engine: the mocker (deterministic vectors), llama-cpp (the tiny GGUF), an openai engine in front
 * of the vLLM simulator (with --engine-embeddings, and one without), and the drain of a worker
 * whose embedding is in flight.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { request as httpRequest, type IncomingMessage } from 'node:http';
import OpenAI from 'openai';
import { mockerEmbedding } from '../src/engine/mocker.js';
import { startEngineSim, simEmbedding, type EngineSim } from './helpers/engine-sim.js';
import { writeTinyLlamaGguf } from './helpers/gguf.js';
import { call, fakeWorker, injectRecord, json, type FakeWorker } from './helpers/http.js';
import { bounded, metricValue, spawnWorker, startFrontend, startWorker, tempDiscoveryUrl, workerReady, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';

const started: EbbProcess[] = [];
let sim: EngineSim;
let frontend: FrontendHandle;
let mocker: WorkerHandle;
let vllmEmbed: WorkerHandle;
/** A worker of m1 that declares embeddings and refuses every one as a draining worker does. */
let refusing: FakeWorker;
const TINY = ['--engine', 'llama-cpp', '--model-path', writeTinyLlamaGguf(), '--threads', '1', '--gpu', 'off', '--context-size', '512'];

before(async () => {
  const discovery = tempDiscoveryUrl();
  sim = await startEngineSim({ kind: 'vllm' });
  const openai = ['--engine', 'openai', '--engine-kind', 'vllm', '--engine-url', sim.url];
  // Spawned together, each stopped at the end even if another never gets ready.
  const spawned = [
    spawnWorker(['--discovery', discovery, '--model', 'm1', '--mocker-ttft-ms', '0']),
    spawnWorker(['--discovery', discovery, '--model', 'vllm-embed', ...openai, '--engine-embeddings']),
    spawnWorker(['--discovery', discovery, '--model', 'vllm-chat', ...openai]),
    spawnWorker(['--discovery', discovery, '--model', 'tiny', ...TINY]),
  ];
  started.push(...spawned);
  [mocker, vllmEmbed] = (await Promise.all(spawned.map(workerReady))) as [WorkerHandle, WorkerHandle];
  refusing = await fakeWorker((req, res) => json(res, req.url === '/embed' ? 503 : 404, { error: { code: 'worker_draining', message: 'worker is draining; retry on another worker', retryable: true } }));
  injectRecord(discovery, { worker_id: 'w-refusing', model: 'm1', request_url: refusing.url, system_url: refusing.url, engine: 'mocker', capabilities: { embeddings: true, max_context: null } });
  frontend = await startFrontend(discovery);
  started.push(frontend);
  // Registered before the frontend started: its first discovery read holds all five.
  await frontend.waitForEvent('discovery_reset', (l) => (l.workers as string[]).length === 5);
});
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
  await sim?.close();
  await refusing?.close();
});

const client = () => new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'unused', maxRetries: 0 });
const norm = (v: ArrayLike<number>) => Math.hypot(...Array.from(v));
const vector = (e: { embedding: unknown }) => Array.from(e.embedding as ArrayLike<number>);

describe('embeddings: the openai SDK against a frontend and its workers', () => {
  it("a worker's refusal (worker_draining) moves the embedding to another worker, unseen by the client", async () => {
    const c = client();
    // Two idle workers of m1: the second request goes to the one the first did not (least loaded, then least recently picked).
    for (let i = 0; i < 2; i++) assert.equal((await c.embeddings.create({ model: 'm1', input: 'the tide turns' })).data.length, 1);
    assert.equal(refusing.seen.filter((r) => r.url === '/embed').length, 1, 'the refusing worker was asked once, then held out');
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_upstream_attempts_total', 'worker_id="w-refusing",outcome="worker_draining"'), 1);
  });

  it('mocker: string and array input, identical vectors for identical inputs, dimensions, base64 and float alike, token ids', async () => {
    const c = client();
    // The SDK asks for base64 unless told otherwise, and decodes it.
    const one = await c.embeddings.create({ model: 'm1', input: 'the tide turns' });
    assert.equal(one.object, 'list');
    assert.equal(one.model, 'm1');
    assert.equal(one.data.length, 1);
    assert.equal(one.data[0]!.object, 'embedding');
    assert.equal(one.data[0]!.index, 0);
    const v = vector(one.data[0]!);
    assert.equal(v.length, 64, '--mocker-embedding-dim default');
    assert.ok(Math.abs(norm(v) - 1) < 1e-5, 'unit length');
    assert.deepEqual(v, Array.from(mockerEmbedding('the tide turns', 64, 64)), "the mocker's vector for that text, float32 exact");
    assert.deepEqual(one.usage, { prompt_tokens: 3, total_tokens: 3 });

    const batch = await c.embeddings.create({ model: 'm1', input: ['the tide turns', 'a quiet harbor', 'the tide turns'] });
    assert.deepEqual(batch.data.map((d) => d.index), [0, 1, 2]);
    assert.deepEqual(vector(batch.data[0]!), v, 'identical input, identical vector (another request, any worker)');
    assert.deepEqual(vector(batch.data[2]!), v);
    assert.notDeepEqual(vector(batch.data[1]!), v);
    assert.equal(batch.usage.prompt_tokens, 9);

    const floats = await c.embeddings.create({ model: 'm1', input: 'the tide turns', encoding_format: 'float' });
    assert.deepEqual(floats.data[0]!.embedding, v, 'float answers the same numbers base64 carries');
    const raw = await c.embeddings.create({ model: 'm1', input: 'the tide turns', encoding_format: 'base64' });
    const b64 = raw.data[0]!.embedding as unknown as string;
    assert.equal(typeof b64, 'string', 'asked for base64: the SDK hands it over undecoded');
    const bytes = Buffer.from(b64, 'base64');
    assert.deepEqual(Array.from({ length: bytes.length / 4 }, (_, i) => bytes.readFloatLE(i * 4)), v, 'little-endian float32, as OpenAI');

    const short = await c.embeddings.create({ model: 'm1', input: 'the tide turns', dimensions: 8 });
    const s = vector(short.data[0]!);
    assert.equal(s.length, 8);
    assert.ok(Math.abs(norm(s) - 1) < 1e-5, 'shortened, then scaled back to unit length');
    assert.deepEqual(s, Array.from(mockerEmbedding('the tide turns', 64, 8)));
    const cosine = s.reduce((sum, x, i) => sum + x * v[i]!, 0) / norm(v.slice(0, 8));
    assert.ok(Math.abs(cosine - 1) < 1e-5, 'the leading components of the full vector, rescaled');

    const ids = await c.embeddings.create({ model: 'm1', input: [[5, 6, 7], [8]] });
    assert.deepEqual(ids.data.map((d) => vector(d).length), [64, 64]);
    assert.equal(ids.usage.prompt_tokens, 4, 'one token per id');

    await assert.rejects(c.embeddings.create({ model: 'm1', input: 'x', dimensions: 65 }), (err: unknown) => err instanceof OpenAI.BadRequestError && err.param === 'dimensions' && /64/.test(err.message));
    await assert.rejects(c.embeddings.create({ model: 'm1', input: [] }), (err: unknown) => err instanceof OpenAI.BadRequestError, 'no input');
    await assert.rejects(c.embeddings.create({ model: 'm1', input: 'x', encoding_format: 'hex' as 'float' }), (err: unknown) => err instanceof OpenAI.BadRequestError);

    assert.equal(await metricValue(frontend.url, 'ebb_frontend_requests_total', 'endpoint="/v1/embeddings",status="200"'), 8, 'counted like the other routes');
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_requests_total', 'endpoint="/v1/embeddings",status="400"'), 3);
    assert.equal(await metricValue(mocker.systemUrl, 'ebb_worker_embedding_inputs_total'), 11, 'one per vector answered');
  });

  it('a model whose workers cannot embed: 400 unsupported_parameter naming why; an unknown model 404; /v1/models says which embed', async () => {
    const c = client();
    await assert.rejects(c.embeddings.create({ model: 'vllm-chat', input: 'x' }), (err: unknown) => {
      assert.ok(err instanceof OpenAI.BadRequestError);
      assert.equal(err.code, 'unsupported_parameter');
      assert.equal(err.param, 'model');
      assert.match(err.message, /no worker that serves embeddings \(engines: openai\)/);
      return true;
    });
    await assert.rejects(c.embeddings.create({ model: 'nope', input: 'x' }), (err: unknown) => err instanceof OpenAI.NotFoundError);
    const models = new Map((await c.models.list()).data.map((m) => [m.id, (m as unknown as { capabilities: string[] }).capabilities]));
    assert.ok(models.get('m1')?.includes('embeddings'));
    assert.ok(models.get('vllm-embed')?.includes('embeddings'));
    assert.ok(models.get('tiny')?.includes('embeddings'));
    assert.ok(!models.get('vllm-chat')?.includes('embeddings'), 'an openai engine embeds only with --engine-embeddings');
  });

  it("openai engine: forwarded to the engine's /v1/embeddings (vLLM's shape), its vectors and usage passed back", async () => {
    const c = client();
    const inputs = ['the tide', 'harbor light at dusk'];
    const res = await c.embeddings.create({ model: 'vllm-embed', input: inputs });
    assert.deepEqual(
      res.data.map((d) => vector(d)),
      inputs.map((x) => simEmbedding(x).map(Math.fround)),
      "the engine's vectors, as float32",
    );
    assert.deepEqual(res.usage, { prompt_tokens: 6, total_tokens: 6 }, "the engine's token count");
    const seen = sim.seen.filter((r) => r.path === '/v1/embeddings').at(-1);
    assert.deepEqual(seen?.body, { model: 'sim-model', input: inputs, encoding_format: 'float' }, "the engine's own model name; floats asked of it");
    // vLLM refuses dimensions for a model without Matryoshka support: the client gets that 400, not a retry.
    await assert.rejects(c.embeddings.create({ model: 'vllm-embed', input: 'x', dimensions: 4 }), (err: unknown) => err instanceof OpenAI.BadRequestError && /matryoshka/.test(err.message));
  });

  it("llama-cpp: node-llama-cpp's embedding context on the tiny model; dimensions only its own", async () => {
    const c = client();
    const res = await c.embeddings.create({ model: 'tiny', input: ['hello world', 'the tides', 'hello world'] });
    const [a, b, again] = res.data.map((d) => vector(d));
    assert.equal(a!.length, 64, "the model's embedding size");
    assert.ok(a!.every(Number.isFinite) && norm(a!) > 0);
    assert.deepEqual(again, a, 'identical input, identical vector');
    assert.notDeepEqual(b, a);
    assert.ok(res.usage.prompt_tokens > 0);
    await assert.rejects(c.embeddings.create({ model: 'tiny', input: 'x', dimensions: 8 }), (err: unknown) => err instanceof OpenAI.BadRequestError && err.param === 'dimensions');
    const same = await c.embeddings.create({ model: 'tiny', input: 'hello world', dimensions: 64 });
    assert.deepEqual(vector(same.data[0]!), a, 'its own size is no change');
  });

  it('a model whose only worker drained: the embedding waits in the admission queue, as a generation does, and is answered once it resumes', async () => {
    const cursor = frontend.mark();
    assert.equal((await call('POST', `${vllmEmbed.systemUrl}/engine/drain`)).body.state, 'drained');
    await frontend.waitForEvent('worker_removed', (l) => l.worker_id === vllmEmbed.workerId, { after: cursor });
    const waiting = client().embeddings.create({ model: 'vllm-embed', input: 'x' }, { headers: { 'x-ebb-service-tier': 'priority', 'x-ebb-tenant': 'search' } });
    const queued = await frontend.waitForEvent('request_queued', (l) => l.model === 'vllm-embed', { after: cursor });
    assert.equal(queued.tier, 'priority', "the header's tier");
    assert.equal(queued.tenant, 'search');
    assert.equal((await call('POST', `${vllmEmbed.systemUrl}/engine/resume`)).body.state, 'serving');
    assert.equal((await waiting).data.length, 1, 'answered by the resumed worker');
  });
});

/** POST /embed whose answer is left unread: the worker's response waits on the socket (backpressure). */
function unreadEmbed(url: string, body: unknown): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${url}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
      res.pause();
      resolve(res);
    });
    req.on('error', reject);
    req.end(JSON.stringify(body));
  });
}

describe('embeddings: drain', () => {
  it('an embedding in flight is counted by the drain, holds drained until its answer is delivered, and a draining worker refuses new ones', async () => {
    // 2048 vectors of 2048 float32s: 22 MB of answer, more than the sockets buffer, so it waits for the reader.
    const w = await startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'm1', '--mocker-ttft-ms', '0', '--mocker-embedding-dim', '2048']);
    started.push(w);
    const input = Array.from({ length: 2048 }, (_, i) => `input ${i}`);
    const pending = unreadEmbed(w.requestUrl, { model: 'm1', input });
    // Computed (counted once its vectors are there), its answer blocked on the unread socket.
    await bounded(
      (async () => {
        while ((await metricValue(w.systemUrl, 'ebb_worker_embedding_requests_total')) !== 1);
      })(),
      'the embedding computed',
    );
    const held = (await call('GET', `${w.systemUrl}/engine/status`)).body;
    assert.equal(held.engine.running_sequences, 0, 'its batch slot given back: only the admission count holds the drain now');
    const drain = await call('POST', `${w.systemUrl}/engine/drain`);
    assert.equal(drain.status, 202);
    assert.equal(drain.body.state, 'draining');
    assert.equal(drain.body.inflight_requests, 1, 'the embedding is in flight');
    const late = await call('POST', `${w.requestUrl}/embed`, { model: 'm1', input: ['late'] });
    assert.equal(late.status, 503);
    assert.equal(late.body.error.code, 'worker_draining');
    const mid = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(mid.body.state, 'draining', 'not drained while the answer is undelivered');
    assert.equal(mid.body.inflight_requests, 1);

    const res = await pending;
    assert.equal(res.statusCode, 200);
    let text = '';
    res.setEncoding('utf8');
    for await (const chunk of res) text += chunk as string;
    const answer = JSON.parse(text) as { data: Array<{ index: number; embedding: string }> };
    assert.equal(answer.data.length, 2048);
    assert.equal(Buffer.from(answer.data[0]!.embedding, 'base64').length, 2048 * 4);
    await w.waitForEvent('state_changed', (l) => l.to === 'drained');
    const after = (await call('GET', `${w.systemUrl}/engine/status`)).body;
    assert.equal(after.inflight_requests, 0);
    assert.equal(await metricValue(w.systemUrl, 'ebb_worker_requests_total', 'outcome="completed"'), 1);
  });
});

describe('embeddings: the tokens one request may carry', () => {
  it("a million tokens are refused at once with OpenAI's default bound: 400 naming input, nothing embedded", async () => {
    const before = await metricValue(mocker.systemUrl, 'ebb_worker_embedding_inputs_total');
    // 2048 inputs (OpenAI's most) of 500 one-word tokens: 1,024,000 tokens, about 2 MB.
    const input = Array.from({ length: 2048 }, () => 'a '.repeat(500).trim());
    const refused = await bounded(
      client().embeddings.create({ model: 'm1', input }).then(
        (r) => `answered ${r.data.length} vectors for ${r.usage.prompt_tokens} tokens`,
        (err: unknown) => err,
      ),
      'the embedding of a million tokens to be answered',
    );
    assert.ok(refused instanceof OpenAI.BadRequestError, String(refused));
    assert.equal(refused.param, 'input');
    assert.match(refused.message, /Requested 1024000 tokens, max 300000 tokens per request/);
    assert.equal(await metricValue(mocker.systemUrl, 'ebb_worker_embedding_inputs_total'), before, 'nothing was embedded');
  });

  it('--max-embedding-tokens: texts whose bytes pass it are counted by the engine tokenizer; token ids count as themselves', async () => {
    const w = await startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'e1', '--mocker-ttft-ms', '0', '--max-embedding-tokens', '1000']);
    started.push(w);
    const embed = (input: string[] | number[][]) => call('POST', `${w.requestUrl}/embed`, { model: 'e1', input });
    const words = (n: number) => 'tide '.repeat(n).trim();
    // 2 x 400 tokens in 3,998 bytes: over the bound by bytes, under it once tokenized.
    const fits = await embed([words(400), words(400)]);
    assert.equal(fits.status, 200, JSON.stringify(fits.body));
    assert.equal(fits.body.usage.prompt_tokens, 800);
    const over = await embed([words(400), words(400), words(400)]);
    assert.equal(over.status, 400);
    assert.deepEqual([over.body.error.code, over.body.error.param], ['invalid_request', 'input']);
    assert.match(over.body.error.message, /^Requested 1200 tokens, max 1000 tokens per request/);
    const ids = await embed([Array.from({ length: 600 }, (_, i) => i), Array.from({ length: 600 }, (_, i) => i)]);
    assert.equal(ids.status, 400);
    assert.match(ids.body.error.message, /^Requested 1200 tokens, max 1000 tokens per request/);
    assert.equal(await metricValue(w.systemUrl, 'ebb_worker_embedding_inputs_total'), 2, 'only the request within the bound was embedded');
  });
});
