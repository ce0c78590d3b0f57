import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { secondTurnWhole } from './helpers/responses.js';
import { call, sseEvents } from './helpers/http.js';
import { frontendSeesWorkers, metricValue, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle } from './helpers/processes.js';
import { redisSkipReason, startRedis, type RedisServer } from './helpers/redis.js';

/** Two frontends sharing one Redis stream store (--stream-store redis://...), two mocker workers. */
describe('resumable streams across frontends: the Redis stream store', { skip: redisSkipReason() }, () => {
  const started: EbbProcess[] = [];
  let redis: RedisServer;
  let a: FrontendHandle;
  let b: FrontendHandle;
  /** A third frontend: two clients resuming one stream at two frontends. */
  let e: FrontendHandle;
  let discovery: string;
  before(async () => {
    redis = await startRedis();
    discovery = tempDiscoveryUrl();
    started.push(...(await Promise.all([0, 1].map(() => startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '20', '--mocker-ttft-ms', '0', '--mocker-max-context', '100000'])))));
    [a, b, e] = (await Promise.all([0, 1, 2].map(() => startFrontend(discovery, ['--stream-store', redis.url])))) as [FrontendHandle, FrontendHandle, FrontendHandle];
    started.push(a, b, e);
    await Promise.all([a, b, e].map((f) => frontendSeesWorkers(f, 2)));
  });
  after(async () => {
    await Promise.all(started.map((p) => p.stop()));
    await redis?.stop();
  });

  /** A client that will resume its stream says so: only then is it kept (and shared). */
  const KEPT = { 'content-type': 'application/json', 'x-ebb-resumable': '1' };
  const body = (maxTokens: number, seed: number) => JSON.stringify({ model: 'm1', messages: [{ role: 'user', content: 'tell me about the tides' }], max_tokens: maxTokens, seed, stream: true });

  /** Raw SSE events of a response, stopping (and closing) after the event `stopAt` when given. */
  async function events(res: Response, stopAt?: number, controller?: AbortController, onEvent: (e: string) => void = () => undefined): Promise<string[]> {
    return sseEvents(res, (e) => {
      onEvent(e);
      return stopAt !== undefined && e.startsWith(`id: ${stopAt}\n`);
    }, { controller });
  }
  const idOf = (e: string[]) => /"id":"(chatcmpl-[0-9a-f]+)"/.exec(e[0]!)![1]!;

  it('a client cut at one frontend resumes at the other while the first still generates: the missed events byte for byte, one [DONE]', async () => {
    const cut = new AbortController();
    const first = await events(await fetch(`${a.url}/v1/chat/completions`, { method: 'POST', headers: KEPT, body: body(80, 1), signal: cut.signal }), 20, cut);
    const id = idOf(first);
    const rest = await events(await fetch(`${b.url}/v1/chat/completions/${id}?stream=true&starting_after=20`));
    assert.ok(rest[0]!.startsWith('id: 21\n'), rest[0]);
    assert.equal(rest.filter((e) => e.endsWith('data: [DONE]')).length, 1);
    const whole = await events(await fetch(`${a.url}/v1/chat/completions/${id}?stream=true`));
    assert.deepEqual([...first, ...rest], whole, 'what the cut client had, then what the other frontend sent: the whole stream');
    // Ended, it is still in the store for the window: another resume there replays it.
    assert.deepEqual(await events(await fetch(`${b.url}/v1/chat/completions/${id}?stream=true&starting_after=40`)), whole.slice(41));
    // Counted once each, as what they were: resumes (through the shared store), not misses here.
    assert.equal(await metricValue(b.url, 'ebb_frontend_stream_resumes_total', 'outcome="resumed"'), 2);
    assert.equal(await metricValue(b.url, 'ebb_frontend_stream_resumes_total', 'outcome="not_found"'), 0);
  });

  it('a frontend SIGKILLed mid-stream: two clients resume at two other frontends, one takes the stream over: byte for byte an undisturbed run, one [DONE], the same usage', async () => {
    const streamBody = (seed: number) => JSON.stringify({ model: 'm1', messages: [{ role: 'user', content: 'tell me about the tides' }], max_tokens: 40, seed, stream: true, stream_options: { include_usage: true } });
    const undisturbed = await events(await fetch(`${b.url}/v1/chat/completions`, { method: 'POST', headers: KEPT, body: streamBody(7) }));
    const cut = new AbortController();
    const first = await events(await fetch(`${a.url}/v1/chat/completions`, { method: 'POST', headers: KEPT, body: streamBody(7), signal: cut.signal }), 10, cut);
    a.proc.kill('SIGKILL');
    const marks = [b.mark(), e.mark()];
    // Two clients resume it at two frontends at once: one continuation, both get it whole.
    const [rest, atE] = (await Promise.all([b, e].map(async (f) => events(await fetch(`${f.url}/v1/chat/completions/${idOf(first)}?stream=true&starting_after=10`))))) as [string[], string[]];
    const tookOver = await Promise.all([b, e].map((f, i) => Promise.resolve(f.logs.slice(marks[i]).filter((l) => l.event === 'stream_taken_over' && l.response_id === idOf(first)).length)));
    assert.equal(tookOver[0]! + tookOver[1]!, 1, 'exactly one frontend took the stream over');
    assert.deepEqual(atE, rest, 'both resumes got the same events');
    // The same request, undisturbed, differs only in its id and creation time, and in what the
    // workers' prefix caches held (cached_tokens: the continuation lands where the prompt is warm).
    const same = (e: string[]) => e.map((x) => x.replaceAll(/chatcmpl-[0-9a-f]+/g, 'ID').replaceAll(/"created":\d+/g, '"created":0').replace(/,"prompt_tokens_details":\{"cached_tokens":\d+\}/, ''));
    assert.deepEqual(same([...first, ...rest]), same(undisturbed));
    assert.equal(rest.filter((e) => e.endsWith('data: [DONE]')).length, 1, 'one end');
    assert.match(rest.at(-2)!, /"usage":\{"prompt_tokens":\d+,"completion_tokens":40,/, 'usage counts the whole answer once');
  });

  it('a Responses API stream whose frontend is SIGKILLed: resumed through the openai SDK at another frontend, taken over, the whole text and usage', async () => {
    const g = await startFrontend(discovery, ['--stream-store', redis.url]);
    started.push(g);
    await frontendSeesWorkers(g, 2);
    const at = (f: FrontendHandle) => new OpenAI({ baseURL: `${f.url}/v1`, apiKey: 'unused', maxRetries: 0, defaultHeaders: { 'x-ebb-resumable': '1' } });
    const request = { model: 'm1', input: 'tell me about the tides', max_output_tokens: 60, stream: true as const };
    let undisturbed = '';
    for await (const ev of await at(b).responses.create(request)) if (ev.type === 'response.output_text.delta') undisturbed += ev.delta;
    let id = '';
    let text = '';
    let last = -1;
    for await (const ev of await at(g).responses.create(request)) {
      if (ev.type === 'response.created') id = ev.response.id;
      if (ev.type === 'response.output_text.delta') text += ev.delta;
      last = ev.sequence_number;
      if (last === 10) break;
    }
    const mark = b.mark();
    g.proc.kill('SIGKILL');
    let end: OpenAI.Responses.Response | undefined;
    for await (const ev of await at(b).responses.retrieve(id, { stream: true, starting_after: last })) {
      assert.equal(ev.sequence_number, ++last, 'sequence numbers run on without a gap');
      if (ev.type === 'response.output_text.delta') text += ev.delta;
      if (ev.type === 'response.incomplete') end = ev.response;
    }
    await b.waitForEvent('stream_taken_over', (l) => l.response_id === id, { after: mark });
    assert.equal(text, undisturbed, 'the text cut and continued is the undisturbed text');
    assert.equal(end?.usage?.output_tokens, 60);
    assert.equal((end?.output[0] as { content: Array<{ text: string }> }).content[0]!.text, undisturbed);
  });

  it('a two-choice stream whose frontend is SIGKILLed while a client follows it at another: taken over there, both choices whole, as undisturbed', async () => {
    const c = await startFrontend(discovery, ['--stream-store', redis.url]);
    started.push(c);
    await frontendSeesWorkers(c, 2);
    const cut = new AbortController();
    const twoChoices = JSON.stringify({ model: 'm1', messages: [{ role: 'user', content: 'tell me about the tides' }], max_tokens: 60, n: 2, seed: 11, stream: true });
    const undisturbed = await events(await fetch(`${b.url}/v1/chat/completions`, { method: 'POST', headers: KEPT, body: twoChoices }));
    const first = await events(await fetch(`${c.url}/v1/chat/completions`, { method: 'POST', headers: KEPT, body: twoChoices, signal: cut.signal }), 6, cut);
    // Once b relays the live stream (its first event came), the frontend running it dies.
    const res = await fetch(`${b.url}/v1/chat/completions/${idOf(first)}?stream=true&starting_after=6`);
    assert.equal(res.status, 200, `resumed at the other frontend: ${res.status === 200 ? '' : await res.text()}`);
    const got = await events(res, undefined, undefined, () => {
      if (c.proc.exitCode === null && c.proc.signalCode === null) c.proc.kill('SIGKILL');
    });
    const choiceText = (all: string[], index: number) =>
      all
        .map((x) => /^data: (\{.*\})$/m.exec(x)?.[1])
        .filter((d): d is string => d !== undefined)
        .map((d) => (JSON.parse(d) as { choices: Array<{ index: number; delta?: { content?: string } }> }).choices.find((ch) => ch.index === index)?.delta?.content ?? '')
        .join('');
    for (const index of [0, 1]) assert.equal(choiceText([...first, ...got], index), choiceText(undisturbed, index), `choice ${index}, cut and taken over, is its undisturbed text`);
    assert.equal(got.filter((e) => e.endsWith('data: [DONE]')).length, 1, 'one end');
  });

  it("a frontend's SIGTERM hands its streams on: past its deadline each of 30 clients gets a stream_interrupted error saying where to resume, resumes at the other frontend and gets the rest, as undisturbed", async () => {
    const d = await startFrontend(discovery, ['--stream-store', redis.url, '--shutdown-grace-ms', '0', '--shutdown-timeout-ms', '300']);
    started.push(d);
    await frontendSeesWorkers(d, 2);
    const seeds = Array.from({ length: 30 }, (_, i) => 100 + i);
    const post = (url: string, seed: number) => fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: KEPT, body: body(400, seed) });
    const text = (e: string[]) => e.map((x) => /"delta":\{"content":("(?:[^"\\]|\\.)*")/.exec(x)?.[1]).filter((x) => x !== undefined).map((x) => JSON.parse(x!) as string).join('');
    const reference = await Promise.all(seeds.map(async (seed) => text(await events(await post(b.url, seed)))));
    // 30 streams at d (400 tokens: 8 s, far past d's 300 ms deadline, and past the last one's start on a loaded machine); once each has begun, d is told to stop.
    let begun = 0;
    let allBegun!: () => void;
    const ready = new Promise<void>((resolve) => (allBegun = resolve));
    const atD = seeds.map(async (seed) => {
      let counted = false;
      return events(await post(d.url, seed), undefined, undefined, () => {
        if (!counted && ++begun === seeds.length) allBegun();
        counted = true;
      });
    });
    await ready;
    d.proc.kill('SIGTERM');
    const cut = await Promise.all(atD);
    const resumed = await Promise.all(
      cut.map(async (e) => {
        const last = e.at(-1)!;
        assert.match(last, /^data: \{"error":\{.*"code":"stream_interrupted"/, `the stream ends with an error saying where to resume it: ${last}`);
        const handOn = (JSON.parse(last.slice('data: '.length)) as { error: { resume: { url: string; last_event_id: number } } }).error.resume;
        return events(await fetch(`${b.url}${handOn.url}`));
      }),
    );
    resumed.forEach((rest, i) => {
      assert.equal(rest.filter((x) => x.endsWith('data: [DONE]')).length, 1, `stream ${i}: one end`);
      assert.equal(text(cut[i]!.slice(0, -1)) + text(rest), reference[i], `stream ${i}: the whole text, as undisturbed`);
    });
  });

  it('the Responses API across the fleet: a background response run at one frontend is followed, retrieved and cancelled at another; a next turn there builds on it', async () => {
    const at = (f: FrontendHandle) => new OpenAI({ baseURL: `${f.url}/v1`, apiKey: 'unused', maxRetries: 0, defaultHeaders: { 'x-ebb-resumable': '1' } });
    // Long (40 s at most): it is still running when retrieved, however slow the machine; it is cancelled below.
    const queued = await at(e).responses.create({ model: 'm1', input: 'tell me about the tides', background: true, max_output_tokens: 2000 });
    for await (const ev of await at(b).responses.retrieve(queued.id, { stream: true, starting_after: 3 })) if (ev.type === 'response.output_text.delta') break;
    assert.equal((await at(b).responses.retrieve(queued.id)).status, 'in_progress');
    const cancelled = await at(b).responses.cancel(queued.id);
    assert.equal(cancelled.status, 'cancelled', 'cancelled by the frontend that runs it, asked at another');
    assert.equal((await at(e).responses.retrieve(queued.id)).status, 'cancelled');
    const first = await at(e).responses.create({ model: 'm1', input: 'tell me about the tides', max_output_tokens: 6 });
    assert.equal((await at(b).responses.retrieve(first.id)).output_text, first.output_text, 'a stored response, retrieved at another frontend');
    const next = await at(b).responses.create({ model: 'm1', input: 'and the moon?', previous_response_id: first.id, max_output_tokens: 4 });
    const whole = await secondTurnWhole(at(b), first.output_text, 4);
    assert.equal(next.output_text, whole.output_text, 'the next turn at another frontend had the conversation as its prefix');
  });

  it('Redis gone: streams run on unkept there, nothing admitted is lost; a resume that needs Redis is a 503 stream_store_unavailable', async () => {
    const running = fetch(`${b.url}/v1/chat/completions`, { method: 'POST', headers: KEPT, body: body(60, 3) }).then((r) => events(r));
    const mark = b.mark();
    await redis.kill();
    await b.waitForEvent('stream_store_unavailable', () => true, { after: mark });
    const done = await running;
    assert.ok(done.at(-1)!.endsWith('data: [DONE]'), 'the stream running when Redis went away completed');
    assert.equal(done.filter((e) => e.includes('"delta":{"content"')).length, 60);
    const fresh = await events(await fetch(`${b.url}/v1/chat/completions`, { method: 'POST', headers: KEPT, body: body(5, 4) }));
    assert.ok(fresh.at(-1)!.endsWith('data: [DONE]'), 'a new stream is served');
    const elsewhere = await call('GET', `${b.url}/v1/chat/completions/chatcmpl-0123456789abcdef?stream=true`);
    assert.equal(elsewhere.status, 503);
    assert.equal(elsewhere.body.error.code, 'stream_store_unavailable');
    // Its own streams are still resumable from its memory.
    assert.equal((await fetch(`${b.url}/v1/chat/completions/${idOf(fresh)}?stream=true`)).status, 200);
  });
});
