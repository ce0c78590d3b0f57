import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { defaultBackoffMs, resumableFetch, StreamCutError, type ResumableFetchOptions, type ResumeEvent } from '@ebb/client';
import { startCuttingServer, type CuttingServer, type SeenRequest, type StreamPlan } from './helpers/cutting-sse-server.js';
import { ASKS, runSdk, type Ask, type Sdk } from './helpers/sdk-streams.js';

/**
 * @ebb/client's resumableFetch through the three SDKs, against a local server that speaks ebb's
 * resumable-stream protocol and cuts its streams: whatever the cut, the SDK assembles exactly what
 * an uncut stream gives it, or, when the stream cannot be resumed, raises the original error.
 */
let server: CuttingServer;
before(async () => {
  server = await startCuttingServer();
});
after(async () => {
  await server.close();
});

const SDKS: Sdk[] = ['openai', 'ai-sdk', 'langchain'];

/** One ask with a plan, through resumableFetch: what the SDK assembled or raised, and the requests it made. */
async function run(sdk: Sdk, ask: Ask, plan: StreamPlan, options: ResumableFetchOptions = {}) {
  server.plan = plan;
  const from = server.seen.length;
  const result = await runSdk(sdk, ask, server.baseURL, resumableFetch(options));
  const requests = server.seen.slice(from);
  return { ...result, requests, resumes: requests.filter((r) => r.method === 'GET') };
}

/** The cuts each ask is put through; Last-Event-ID each resume must carry (5 whole events before the first cut). */
const CUTS: Array<{ how: string; plan: StreamPlan; lastEventIds: string[] }> = [
  { how: 'in the middle of an event', plan: { cuts: [{ after: 5, kind: 'mid-event' }] }, lastEventIds: ['4'] },
  { how: 'between events (the connection lost)', plan: { cuts: [{ after: 5, kind: 'between-events' }] }, lastEventIds: ['4'] },
  { how: 'by a body that ends before its end event', plan: { cuts: [{ after: 5, kind: 'ended' }] }, lastEventIds: ['4'] },
  { how: 'with the hand-on error event', plan: { cuts: [{ after: 5, kind: 'hand-on' }] }, lastEventIds: ['4'] },
  { how: 'twice: mid-event, then the resumed connection handed on', plan: { cuts: [{ after: 3, kind: 'mid-event' }, { after: 4, kind: 'hand-on' }] }, lastEventIds: ['2', '6'] },
];

/** A resume at the request's own base URL (the load balancer's prefix kept), for the stream's id. */
const RESUME_PATH = /^\/lb\/v1\/(chat\/completions|completions|responses)\/(chatcmpl-|cmpl-|resp_)\d+\?stream=true$/;

/** An error and its causes. */
function chain(error: unknown): unknown[] {
  const out: unknown[] = [];
  for (let e = error; e !== undefined && e !== null && out.length < 5; e = (e as { cause?: unknown }).cause) out.push(e);
  return out;
}

/** The error code an SDK's error carries, wherever it keeps it. */
function codeOf(error: unknown): unknown {
  const e = error as { code?: unknown; error?: { code?: unknown }; data?: { error?: { code?: unknown }; code?: unknown } } | undefined;
  return e?.code ?? e?.error?.code ?? e?.data?.error?.code ?? e?.data?.code;
}

for (const sdk of SDKS) {
  describe(`${sdk}: a cut stream reads as an uncut one`, () => {
    for (const ask of ASKS[sdk]) {
      it(`${ask}: cut mid-event, between events, ended early, handed on, and twice`, async () => {
        const whole = await run(sdk, ask, {});
        assert.equal(whole.error, undefined, `uncut: ${String(whole.error)}`);
        assert.equal(whole.requests.length, 1);
        assert.equal(whole.requests[0]?.headers['x-ebb-resumable'], '1', 'the streamed request asks ebb to keep its stream');
        for (const { how, plan, lastEventIds } of CUTS) {
          const cut = await run(sdk, ask, plan);
          assert.equal(cut.error, undefined, `${how}: the SDK raised ${String(cut.error)}`);
          assert.deepEqual(cut.assembled, whole.assembled, `${how}: what the SDK assembled`);
          assert.deepEqual(cut.resumes.map((r) => r.headers['last-event-id']), lastEventIds, `${how}: each resume from the last whole event`);
          for (const r of cut.resumes) assert.match(r.url, RESUME_PATH, `${how}: resumed at the same base URL`);
          assert.equal(new Set(cut.resumes.map((r) => r.url)).size, 1, `${how}: every resume of one stream`);
        }
      });
    }

    it('a refused resume (404): the SDK raises the original error, never a short answer', async () => {
      for (const ask of ['chat', 'responses'] as const) {
        const handedOn = await run(sdk, ask, { cuts: [{ after: 5, kind: 'hand-on' }], resumes: [404] });
        assert.notEqual(handedOn.error, undefined, `${ask}, handed on: raised`);
        assert.equal(codeOf(handedOn.error), 'stream_interrupted', `${ask}, handed on: the hand-on event itself is raised: ${String(handedOn.error)}`);
        assert.equal(handedOn.resumes.length, 1, `${ask}: a 404 is final, not retried`);

        server.plan = { cuts: [{ after: 5, kind: 'between-events' }] };
        const plain = await runSdk(sdk, ask, server.baseURL);
        const lost = await run(sdk, ask, { cuts: [{ after: 5, kind: 'between-events' }], resumes: [404] });
        assert.notEqual(lost.error, undefined, `${ask}, connection lost: raised`);
        assert.equal(String(lost.error), String(plain.error), `${ask}, connection lost: the error the SDK raises without resumableFetch`);
        assert.equal(lost.resumes.length, 1);

        const ended = await run(sdk, ask, { cuts: [{ after: 5, kind: 'ended' }], resumes: [404] });
        assert.ok(chain(ended.error).some((e) => e instanceof StreamCutError), `${ask}, ended early: raised StreamCutError, not a short answer: ${String(ended.error)}`);
      }
    });
  });
}

describe('resumableFetch', () => {
  const client = (options: ResumableFetchOptions = {}) => new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0, fetch: resumableFetch(options) });
  const chatText = async (c: OpenAI) => {
    let text = '';
    for await (const chunk of await c.chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'hi' }], stream: true })) text += chunk.choices[0]?.delta.content ?? '';
    return text;
  };
  const TEXT = 'The tide turns twice a day: naïve ☃ café 🌊.';
  const since = (from: number): SeenRequest[] => server.seen.slice(from);

  it('asks to keep only streamed generations, and hands every other answer on untouched', async () => {
    const answers: Response[] = [];
    const recording: typeof fetch = async (input, init) => {
      const res = await fetch(input, init);
      answers.push(res);
      return res;
    };
    const f = resumableFetch({ fetch: recording });
    server.plan = {};
    const from = server.seen.length;
    const post = (path: string, body: unknown) => f(`${server.baseURL}/${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    const whole = await post('chat/completions', { model: 'm1', messages: [], stream: false });
    assert.equal(whole, answers.at(-1), 'a JSON answer is the underlying fetch\'s own Response');
    const streamed = await post('responses', { model: 'm1', input: 'hi', stream: true });
    assert.notEqual(streamed, answers.at(-1), 'a kept stream gets the spliced body');
    const id = /"id":"(resp_\d+)"/.exec(await streamed.text())?.[1];
    assert.ok(id);
    const object = await f(`${server.baseURL}/responses/${id}`);
    assert.equal(object, answers.at(-1), 'GET of the response object: untouched');
    assert.equal((await object.json()).id, id);
    const followed = await f(new Request(`${server.baseURL}/responses/${id}?stream=true&starting_after=3`));
    assert.equal(/^id: (\d+)$/m.exec(await followed.text())?.[1], '4', 'a GET of the stream (a Request object) from after 3');
    assert.deepEqual(
      since(from).map((r) => [r.method, r.url.replace(/\d+/g, 'N'), r.headers['x-ebb-resumable'] ?? null]),
      [
        ['POST', '/lb/vN/chat/completions', null],
        ['POST', '/lb/vN/responses', '1'],
        ['GET', '/lb/vN/responses/resp_N', null],
        ['GET', '/lb/vN/responses/resp_N?stream=true&starting_after=N', '1'],
      ],
    );

    // A stream the server did not keep (no x-ebb-resumable on its answer): the SDK's own, cut and all.
    server.plan = { keep: false, cuts: [{ after: 5, kind: 'ended' }] };
    const unkept = await post('chat/completions', { model: 'm1', messages: [], stream: true });
    assert.equal(unkept, answers.at(-1), 'an unkept stream: untouched');
    await unkept.text();
    assert.equal(since(from).filter((r) => r.method === 'GET').length, 2, 'no resume of a stream nobody kept');
  });

  it('a POST cut before it said its response id is not retried (that could generate twice): the original error', async () => {
    const told: ResumeEvent[] = [];
    server.plan = { cuts: [{ after: 0, kind: 'mid-event' }] };
    const from = server.seen.length;
    await assert.rejects(chatText(client({ onResume: (e) => told.push(e) })), (err: Error) => err.message === 'terminated');
    assert.deepEqual(since(from).map((r) => r.method), ['POST']);
    assert.deepEqual(told.map((e) => [e.cause, e.responseId, e.outcome]), [['connection_lost', undefined, 'gave_up']]);
  });

  it('retries are bounded: the first at once, then the back-off, then the original error', async () => {
    const told: ResumeEvent[] = [];
    const pauses: number[] = [];
    server.plan = { cuts: [{ after: 5, kind: 'hand-on' }], resumes: [503, 503, 503, 503] };
    const from = server.seen.length;
    const c = client({ retries: 3, backoffMs: (attempt) => (pauses.push(attempt), 0), onResume: (e) => told.push(e) });
    await assert.rejects(chatText(c), (err: unknown) => err instanceof OpenAI.APIError && err.code === 'stream_interrupted');
    assert.deepEqual(pauses, [0, 1, 2], 'a pause asked before each try');
    assert.equal(since(from).filter((r) => r.method === 'GET').length, 3);
    assert.deepEqual(told.map((e) => [e.attempt, e.outcome, e.status]), [[1, 'retrying', 503], [2, 'retrying', 503], [3, 'gave_up', 503]]);
    assert.ok(told.every((e) => e.cause === 'handed_on' && e.lastEventId === '4' && /^chatcmpl-\d+$/.test(e.responseId ?? '')));

    server.plan = { cuts: [{ after: 5, kind: 'hand-on' }], resumes: [503, 503] };
    told.length = 0;
    assert.equal(await chatText(client({ retries: 3, backoffMs: () => 0, onResume: (e) => told.push(e) })), TEXT, 'the third try resumes it');
    assert.deepEqual(told.map((e) => e.outcome), ['retrying', 'retrying', 'resumed']);
  });

  it('the default back-off: the first try at once, all of them within the resume grace (15 s)', () => {
    assert.equal(defaultBackoffMs(0), 0);
    let total = 0;
    for (let attempt = 1; attempt < 8; attempt++) {
      const ms = defaultBackoffMs(attempt);
      assert.ok(ms > 0 && ms <= 2000, `try ${attempt + 1}: ${ms} ms`);
      total += ms;
    }
    assert.ok(total < 15_000, `${total} ms in all`);
  });

  it('a resume that does not go on from the last event (the store lost some) is refused: the original error, no gap handed on', async () => {
    server.plan = { cuts: [{ after: 5, kind: 'hand-on' }], gap: true };
    const told: ResumeEvent[] = [];
    let text = '';
    const c = client({ onResume: (e) => told.push(e) });
    await assert.rejects(
      (async () => {
        for await (const chunk of await c.chat.completions.create({ model: 'm1', messages: [], stream: true })) text += chunk.choices[0]?.delta.content ?? '';
      })(),
      (err: unknown) => err instanceof OpenAI.APIError && err.code === 'stream_interrupted',
    );
    assert.equal(text, 'The tide turns twice', 'the events before the cut, none after the gap');
    assert.deepEqual(told.map((e) => e.outcome), ['resumed', 'gave_up']);
  });

  it('the caller\'s abort is not a cut: nothing is resumed', async () => {
    server.plan = { cuts: [{ after: 3, kind: 'hold' }] };
    const told: ResumeEvent[] = [];
    const from = server.seen.length;
    const abort = new AbortController();
    const res = await resumableFetch({ onResume: (e) => told.push(e) })(`${server.baseURL}/chat/completions`, { method: 'POST', body: JSON.stringify({ model: 'm1', messages: [], stream: true }), signal: abort.signal });
    const reader = res.body!.getReader();
    let seen = '';
    while ((seen.match(/^id: /gm) ?? []).length < 3) seen += new TextDecoder().decode((await reader.read()).value);
    const next = reader.read();
    abort.abort();
    await assert.rejects(next, (err: Error) => err.name === 'AbortError', 'the read ends with the abort (not the stream resumed)');
    assert.deepEqual(since(from).map((r) => r.method), ['POST']);
    assert.deepEqual(told, []);
  });

  it('a hook that throws does not break the stream', async () => {
    server.plan = { cuts: [{ after: 5, kind: 'mid-event' }] };
    assert.equal(await chatText(client({ onResume: () => { throw new Error('a broken logger'); } })), TEXT);
  });

  it('background responses: the POST\'s stream and a retrieve stream from a point are resumed', async () => {
    const c = client();
    server.plan = { cuts: [{ after: 5, kind: 'hand-on' }, { after: 4, kind: 'mid-event' }] };
    let id = '';
    let text = '';
    for await (const event of await c.responses.create({ model: 'm1', input: 'hi', background: true, stream: true })) {
      if (event.type === 'response.created') {
        id = event.response.id;
        assert.equal(event.response.status, 'queued');
      }
      if (event.type === 'response.output_text.delta') text += event.delta;
    }
    assert.equal(text, TEXT);
    // Followed from after event 6 (two deltas in), cut at once and again: resumed after 6, then after what came.
    server.replan(id, { cuts: [{ after: 0, kind: 'between-events' }, { after: 3, kind: 'ended' }] });
    const from = server.seen.length;
    const sequence: number[] = [];
    text = '';
    for await (const event of await c.responses.retrieve(id, { stream: true, starting_after: 6 })) {
      sequence.push(event.sequence_number);
      if (event.type === 'response.output_text.delta') text += event.delta;
    }
    assert.deepEqual(sequence, Array.from({ length: 20 - 7 }, (_, i) => 7 + i), 'every event after 6, once, in order');
    assert.equal(text, TEXT.slice('The tide turns'.length));
    assert.deepEqual(since(from).map((r) => [r.url.replace(id, 'ID'), r.headers['last-event-id'] ?? null]), [
      ['/lb/v1/responses/ID?stream=true&starting_after=6', null],
      ['/lb/v1/responses/ID?stream=true', '6'],
      ['/lb/v1/responses/ID?stream=true', '9'],
    ]);
  });
});
