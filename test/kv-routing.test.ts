import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { call } from './helpers/http.js';
import { bounded, startKvFleet, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { streamCompletion } from './helpers/sse.js';
import { sseData } from '../src/common/sse-events.js';
import { words } from './helpers/words.js';

/**
 * Prefix-cache-aware routing through real processes: three mocker workers (their prefix caches on,
 * KV events on /kv/events) and a frontend with --router kv. One fleet for every case, in order:
 * the choice follows the cache; a drained worker is never chosen however good its overlap, and its
 * entries are kept masked; resumed, it is warm at once; a stream handed off at a drain deadline
 * moves to the worker holding its prompt.
 */
const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

const WORKER_ARGS = ['--model', 'm1', '--mocker-ttft-ms', '0', '--mocker-itl-ms', '5', '--mocker-max-context', '8192'];
/** 400-word documents: 25 whole blocks (+ "user:") cached wherever one was prefilled. */
const doc = (tag: string) => words(400, tag);
const DOC_CACHED = 384;

let workers: WorkerHandle[];
let frontend: FrontendHandle;
let adminUrl: string;
let client: OpenAI;

/** A chat through the frontend: which worker answered, and what it said was cached. */
async function ask(content: string): Promise<{ worker: string; cached: number }> {
  const { data, response } = await client.chat.completions.create({ model: 'm1', messages: [{ role: 'user', content }], max_tokens: 2 }).withResponse();
  return { worker: response.headers.get('x-ebb-worker-id') ?? '', cached: data.usage?.prompt_tokens_details?.cached_tokens ?? -1 };
}

/** Resolves once the frontend indexed at least `blocks` blocks for `workerId` from its KV events. */
function indexed(workerId: string, blocks: number, after = frontend.mark()) {
  return frontend.waitForEvent('kv_indexed', (l) => l.worker_id === workerId && (l.cached_blocks as number) >= blocks, { after });
}

async function kvOf(workerId: string): Promise<{ cached_blocks: number; masked: boolean; mode: string }> {
  const r = await call('GET', `${adminUrl}/workers/${workerId}`);
  return r.body.kv;
}

before(async () => {
  let frontends: FrontendHandle[];
  ({ workers, frontends } = await startKvFleet(WORKER_ARGS, { workers: 3, frontends: 1 }));
  started.push(...workers, ...frontends);
  frontend = frontends[0]!;
  adminUrl = (await frontend.waitForEvent('admin_ready')).url as string;
  client = new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'unused', maxRetries: 0 });
});

const home = new Map<string, string>(); // document tag -> the worker that prefilled it

describe('kv routing (real processes)', () => {
  it('routes a prompt to the worker holding its prefix, and cached_tokens says so', async () => {
    for (const tag of ['a', 'b', 'c']) {
      const mark = frontend.mark();
      const cold = await ask(doc(tag));
      assert.equal(cold.cached, 0);
      home.set(tag, cold.worker);
      await indexed(cold.worker, 25, mark);
    }
    for (const tag of ['a', 'b', 'c']) {
      for (let turn = 0; turn < 2; turn++) {
        const warm = await ask(`${doc(tag)} question ${turn}`);
        assert.equal(warm.worker, home.get(tag), `turn ${turn} of ${tag} goes where ${tag} is cached`);
        assert.ok(warm.cached >= DOC_CACHED, `cached_tokens ${warm.cached}`);
      }
    }
    const view = await kvOf(home.get('a')!);
    assert.equal(view.mode, 'exact');
    assert.ok(view.cached_blocks >= 25 && view.masked === false, JSON.stringify(view));
    const metrics = await (await fetch(`${frontend.url}/metrics`)).text();
    assert.match(metrics, /ebb_frontend_routing_decisions_total\{router="kv"\} [1-9]/);
    assert.match(metrics, /ebb_frontend_kv_overlap_tokens_total [1-9]/);
  });

  it('never sends a request to a drained worker, however good its overlap; its entries stay, masked', async () => {
    const target = workers.find((w) => w.workerId === home.get('a'))!;
    // Document d is cached on the target only (seeded on its request plane), for the resume case.
    const seededAt = frontend.mark();
    const seeded = await call('POST', `${target.requestUrl}/generate`, { model: 'm1', messages: [{ role: 'user', content: doc('d') }], max_tokens: 1, stream: false });
    assert.equal(seeded.status, 200, JSON.stringify(seeded.body));
    await indexed(target.workerId, 50, seededAt);
    const left = frontend.mark();
    const drain = await call('POST', `${target.systemUrl}/engine/drain`, { reason: 'kv test' });
    assert.ok(drain.status === 200 || drain.status === 202, JSON.stringify(drain.body));
    if (drain.body.state !== 'drained') await target.waitForEvent('state_changed', (l) => l.to === 'drained');
    await frontend.waitForEvent('worker_removed', (l) => l.worker_id === target.workerId, { after: left });
    for (let turn = 0; turn < 3; turn++) {
      const r = await ask(`${doc('a')} while drained ${turn}`);
      assert.notEqual(r.worker, target.workerId, 'a drained worker is not scored');
    }
    const view = await kvOf(target.workerId);
    assert.ok(view.masked && view.cached_blocks >= 25, `kept, masked: ${JSON.stringify(view)}`);
  });

  it('a resumed worker is warm at once: its prompts go back to it, served from its cache', async () => {
    const target = workers.find((w) => w.workerId === home.get('a'))!;
    const back = frontend.mark();
    const resumed = await call('POST', `${target.systemUrl}/engine/resume`);
    assert.equal(resumed.status, 200, JSON.stringify(resumed.body));
    await frontend.waitForEvent('worker_added', (l) => l.worker_id === target.workerId, { after: back });
    // No snapshot to wait for: the entries were kept while it was drained.
    const r = await ask(`${doc('d')} after resume`);
    assert.equal(r.worker, target.workerId, 'its prompt goes back to it at once');
    assert.ok(r.cached >= DOC_CACHED, `served warm: ${JSON.stringify(r)}`);
    assert.equal((await kvOf(target.workerId)).masked, false);
  });

  it('a continuation is routed by its prompt and what was delivered: to the worker holding both, not to one holding the prompt alone', async () => {
    const [x, y, z] = workers as [WorkerHandle, WorkerHandle, WorkerHandle];
    const chat = (tag: string) => [{ role: 'user', content: doc(tag) }];
    // Seeds `tag` (and `maxTokens` of its answer) on `w`'s request plane; resolves once the frontend indexed `blocks` more there.
    const seed = async (w: WorkerHandle, tag: string, maxTokens: number, blocks: number) => {
      const before = (await kvOf(w.workerId)).cached_blocks;
      const mark = frontend.mark();
      const r = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', messages: chat(tag), max_tokens: maxTokens, stream: false });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      await indexed(w.workerId, before + blocks, mark);
    };
    // g (the stream's prompt) on x only, h on z only: 25 blocks each.
    await seed(x, 'g', 1, 25);
    await seed(z, 'h', 1, 25);
    // A stream of h holds z busy (one request in flight there) for the whole case.
    const busy = new AbortController();
    const onZ = await fetch(`${frontend.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'm1', messages: chat('h'), max_tokens: 100_000, stream: true }), signal: busy.signal });
    assert.equal(onZ.headers.get('x-ebb-worker-id'), z.workerId, 'h is routed where it is cached');
    // The stream of g starts on x, where g is cached.
    const streaming = new AbortController();
    const res = await fetch(`${frontend.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'm1', messages: chat('g'), max_tokens: 3000, stream: true }), signal: streaming.signal });
    assert.equal(res.headers.get('x-ebb-worker-id'), x.workerId);
    // Meanwhile y gets g alone; z gets g and its answer's first 300 words (the mocker answers a prompt alike everywhere).
    // (g, "assistant:" and 300 words: 702 tokens, 43 whole blocks.)
    await Promise.all([seed(y, 'g', 1, 25), seed(z, 'g', 300, 43)]);
    // Once the client has 200 tokens, x's drain hands the stream off: prompt + delivered text is on z
    // (busy: 64 tokens' worth), the prompt alone on y (idle) too.
    let tokens = 0;
    let enough!: () => void;
    const read = new Promise<void>((resolve) => (enough = resolve));
    const reading = (async () => {
      for await (const data of sseData(res.body as AsyncIterable<Uint8Array>)) if (data !== '[DONE]' && typeof JSON.parse(data).choices?.[0]?.delta?.content === 'string' && ++tokens === 200) enough();
    })().catch(() => undefined);
    await bounded(read, 'the client to read 200 tokens of the stream on x');
    const mark = frontend.mark();
    const drain = await call('POST', `${x.systemUrl}/engine/drain`, { reason: 'kv continuation', deadline_ms: 200 });
    assert.ok(drain.status === 200 || drain.status === 202, JSON.stringify(drain.body));
    const moved = await frontend.waitForEvent('stream_migrated', (l) => l.from_worker === x.workerId, { after: mark });
    assert.equal(moved.to_worker, z.workerId, `the continuation went where its prompt and delivered text are cached, not to ${y.workerId} (the prompt alone)`);
    streaming.abort();
    busy.abort();
    await reading;
    const back = frontend.mark();
    assert.equal((await call('POST', `${x.systemUrl}/engine/resume`)).status, 200);
    await frontend.waitForEvent('worker_added', (l) => l.worker_id === x.workerId, { after: back });
  });

  it("a stream handed off at a drain deadline moves to the worker holding its prompt and what it delivered", async () => {
    // e is cached on two workers (seeded on their request planes), not on the third.
    const [x, y, z] = workers;
    const mark = frontend.mark();
    for (const w of [x!, y!]) {
      const r = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', messages: [{ role: 'user', content: doc('e') }], max_tokens: 1, stream: false });
      assert.equal(r.status, 200, JSON.stringify(r.body));
    }
    await indexed(x!.workerId, 25, mark);
    await indexed(y!.workerId, 25, mark);
    // Long enough (1,000 tokens at 5 ms) that the drain's 200 ms deadline comes well before its end.
    let streamingNow!: () => void;
    const firstToken = new Promise<void>((resolve) => (streamingNow = resolve));
    const streaming = streamCompletion(frontend.url, { model: 'm1', messages: [{ role: 'user', content: doc('e') }], max_tokens: 1000 }, () => streamingNow());
    const opened = await frontend.waitForEvent('route_decision', (l) => l.prompt_tokens === 401, { after: mark });
    const firstWorker = opened.worker_id as string;
    assert.ok(firstWorker === x!.workerId || firstWorker === y!.workerId, 'the stream starts where its prompt is cached');
    await firstToken;
    const from = workers.find((w) => w.workerId === firstWorker)!;
    const other = from === x ? y! : x!;
    const drain = await call('POST', `${from.systemUrl}/engine/drain`, { reason: 'kv hand-off', deadline_ms: 200 });
    assert.ok(drain.status === 200 || drain.status === 202, JSON.stringify(drain.body));
    const moved = await frontend.waitForEvent('stream_migrated', (l) => l.from_worker === firstWorker, { after: mark });
    assert.equal(moved.to_worker, other.workerId, `the hand-off went to the other worker holding the prompt, not to ${z!.workerId}`);
    const outcome = await streaming;
    assert.equal(outcome.tokens, 1000);
  });
});
