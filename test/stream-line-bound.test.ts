import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import type { ServerResponse } from 'node:http';
import { fakeWorker, injectRecord, json, call, type FakeWorker } from './helpers/http.js';
import { bounded, metricValue, startFrontend, tempDiscoveryUrl, type EbbProcess, type FrontendHandle } from './helpers/processes.js';
import { streamCompletion } from './helpers/sse.js';

/*
 * Issue 42 item 12: a token line past the frontend's 1 MiB line bound is the answer's, not a worker
 * failing: the stream ends with an error event, no continuation is tried (any worker would send the
 * same token), and nothing runs on after the client left. And a request every worker takes, then
 * fails before its first token, is answered instead of queued again for ever.
 */

const started: EbbProcess[] = [];
const fakes: FakeWorker[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
  await Promise.all(fakes.map((f) => f.close()));
});

/** What a fake worker declares: it can continue a sequence (the frontend migrates only to such workers). */
const CONTINUES = { json_object: false, json_schema: false, logprobs: false, tools: false, max_context: null, continuation: true, prompt_token_ids: false, embeddings: false };
/** One token line of 2 MiB, newline included: past the frontend's bound. */
const HUGE_TOKEN = JSON.stringify({ text: 'x'.repeat(2 * 1024 * 1024) }) + '\n';
const TOKENS = 8;

const ndjson = (lines: unknown[]) => lines.map((l) => JSON.stringify(l) + '\n').join('');

interface StreamingFake extends FakeWorker {
  id: string;
  generates: () => number;
  continuations: () => number;
  /** The fresh streams opened so far go on with `then`. */
  proceed(): void;
}

/**
 * A fake worker of m1: a fresh request gets TOKENS tokens, then, once the test calls proceed(),
 * `then` (the huge token, or a death); a continuation gets `continued` at once.
 */
async function streamingFake(discovery: string, id: string, then: (res: ServerResponse) => void, continued: (res: ServerResponse) => void): Promise<StreamingFake> {
  let waiting: ServerResponse[] = [];
  let proceeding = false;
  const fake = await fakeWorker((req, res) => {
    if (req.url !== '/generate') return json(res, 404, {});
    res.writeHead(200, { 'content-type': 'application/x-ndjson' });
    if (JSON.parse(req.body).continuation !== undefined) return continued(res);
    res.write(ndjson(Array.from({ length: TOKENS }, (_, i) => ({ text: ` t${i}` }))));
    if (proceeding) then(res);
    else waiting.push(res);
  });
  fakes.push(fake);
  injectRecord(discovery, { worker_id: id, model: 'm1', request_url: fake.url, system_url: fake.url, engine: 'fake', capabilities: CONTINUES });
  const bodies = () => fake.seen.filter((r) => r.url === '/generate').map((r) => JSON.parse(r.body));
  return Object.assign(fake, {
    id,
    generates: () => bodies().length,
    continuations: () => bodies().filter((b) => b.continuation !== undefined).length,
    proceed() {
      proceeding = true;
      for (const res of waiting) then(res);
      waiting = [];
    },
  });
}

async function frontendFor(discovery: string, ids: string[]): Promise<FrontendHandle> {
  const fe = await startFrontend(discovery);
  started.push(fe);
  await fe.waitForEvent('frontend_ready');
  for (const id of ids) await fe.waitForLog((l) => (l.event === 'worker_added' && l.worker_id === id) || (l.event === 'discovery_reset' && (l.workers as string[]).includes(id)), `frontend sees ${id}`);
  return fe;
}

const inflight = (fe: FrontendHandle, id: string) => metricValue(fe.url, 'ebb_frontend_worker_inflight_requests', `worker_id="${id}"`);
const sum = (fs: StreamingFake[], f: (x: StreamingFake) => number) => fs.reduce((n, x) => n + f(x), 0);

describe('a token line past the frontend line bound', () => {
  it('ends the stream with an error event after the tokens before it, continued on no other worker', async () => {
    const discovery = tempDiscoveryUrl();
    const huge = (res: ServerResponse) => res.write(HUGE_TOKEN);
    const ws = [await streamingFake(discovery, 'w-a', huge, huge), await streamingFake(discovery, 'w-b', huge, huge)];
    const fe = await frontendFor(discovery, ['w-a', 'w-b']);
    const r = await bounded(
      streamCompletion(fe.url, { model: 'm1' }, undefined, (n) => n === TOKENS && ws.forEach((w) => w.proceed())),
      'the stream ended by an error event once the huge token came',
    );
    const from = ws.find((w) => w.generates() === 1)!;
    assert.equal(r.tokens, TOKENS, 'every token before the huge one reached the client');
    assert.equal(r.done, false);
    assert.equal(r.errorCode, 'worker_failed_mid_stream');
    assert.ok(r.error?.startsWith(`worker ${from.id} failed mid-stream: a stream line over 1048576 bytes`), r.error);
    assert.equal(sum(ws, (w) => w.generates()), 1, 'no continuation was tried');
    for (const w of ws) assert.equal(await inflight(fe, w.id), 0, `${w.id} released`);
  });

  it('runs nothing on once the client left: the stream ends there and its worker is released', async () => {
    const discovery = tempDiscoveryUrl();
    const huge = (res: ServerResponse) => res.write(HUGE_TOKEN);
    const ws = [await streamingFake(discovery, 'w-a', huge, huge), await streamingFake(discovery, 'w-b', huge, huge)];
    const fe = await frontendFor(discovery, ['w-a', 'w-b']);
    const client = new AbortController();
    const res = await fetch(`${fe.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm1', messages: [{ role: 'user', content: 'x' }], stream: true }),
      signal: client.signal,
    });
    assert.equal(res.status, 200);
    const reader = (res.body as ReadableStream<Uint8Array>).getReader();
    let seen = '';
    while ((seen.match(/"content"/g) ?? []).length < TOKENS) seen += Buffer.from((await reader.read()).value!).toString();
    client.abort();
    // The huge token comes after the client left, as the reporter's did (8 events, then nothing).
    const ended = fe.waitForNextEvent('midstream_failure');
    for (const w of ws) w.proceed();
    const failure = await bounded(ended, 'the frontend ending the stream at the huge token');
    assert.match(String(failure.err), /a stream line over 1048576 bytes/);
    assert.equal(sum(ws, (w) => w.generates()), 1, 'no continuation ran after the client left');
    for (const w of ws) assert.equal(await inflight(fe, w.id), 0, `${w.id} released`);
  });

  it('ends a continuation whose first line is past the bound with an error event, tried on no third worker', async () => {
    const discovery = tempDiscoveryUrl();
    const die = (res: ServerResponse) => res.socket?.destroy();
    const huge = (res: ServerResponse) => res.write(HUGE_TOKEN);
    const ws = [await streamingFake(discovery, 'w-a', die, huge), await streamingFake(discovery, 'w-b', die, huge), await streamingFake(discovery, 'w-c', die, huge)];
    const fe = await frontendFor(discovery, ['w-a', 'w-b', 'w-c']);
    const r = await bounded(
      streamCompletion(fe.url, { model: 'm1' }, undefined, (n) => n === TOKENS && ws.forEach((w) => w.proceed())),
      'the stream ended by an error event once the continuation sent the huge token',
    );
    assert.equal(sum(ws, (w) => w.continuations()), 1, 'one continuation, on one worker');
    assert.equal(sum(ws, (w) => w.generates()), 2);
    const from = ws.find((w) => w.generates() - w.continuations() === 1)!;
    const to = ws.find((w) => w.continuations() === 1)!;
    assert.equal(r.tokens, TOKENS);
    assert.equal(r.errorCode, 'worker_failed_mid_stream');
    assert.ok(r.error?.startsWith(`worker ${from.id} closed the stream before it finished; no other worker continued it: worker ${to.id} sent a stream line over 1048576 bytes`), r.error);
    for (const w of ws) assert.equal(await inflight(fe, w.id), 0, `${w.id} released`);
  });
});

describe('a request every worker fails before its first token', () => {
  it('is answered after bounded attempts instead of queued again for ever: the second worker it broke ends it', async () => {
    const discovery = tempDiscoveryUrl();
    const ws: FakeWorker[] = [];
    for (const id of ['w-a', 'w-b']) {
      const fake = await fakeWorker((_req, res) => {
        res.writeHead(200, { 'content-type': 'application/x-ndjson' });
        res.end(ndjson([{ error: { code: 'engine_error', message: 'the engine failed' } }]));
      });
      fakes.push(fake);
      ws.push(fake);
      injectRecord(discovery, { worker_id: id, model: 'm1', request_url: fake.url, system_url: fake.url });
    }
    // The admission queue is on (the default): a no_serving_worker answer sends the request back into it.
    const fe = await frontendFor(discovery, ['w-a', 'w-b']);
    const r = await bounded(call('POST', `${fe.url}/v1/completions`, { model: 'm1', prompt: 'x', max_tokens: 2 }), 'the request answered');
    // Each failure after taking it is a worker lost under the request (worker-losses.ts): the second ends it.
    assert.equal(r.status, 500);
    assert.equal(r.body.error.code, 'request_broke_workers');
    const tries = ws.reduce((n, w) => n + w.seen.length, 0);
    assert.equal(tries, 2, `${tries} attempts: one per worker, no third`);
  });
});
