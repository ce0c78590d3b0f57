import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { Agent, fetch as undiciFetch } from 'undici';
import { secondTurnWhole } from './helpers/responses.js';
import { call, sseEvents } from './helpers/http.js';
import { setTimeout as sleep } from 'node:timers/promises';
import { bounded, frontendSeesWorkers, metricValue, startFleet, startFrontend, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';

/** Streams that outlive their connection: one frontend (the embedded memory store), two mocker workers. */
const started: EbbProcess[] = [];
let discovery: string;
let frontend: FrontendHandle;
let workers: WorkerHandle[];
before(async () => {
  ({ discovery, frontend, workers } = await startFleet(2, ['--mocker-itl-ms', '20', '--mocker-ttft-ms', '0', '--mocker-max-context', '100000']));
  started.push(...workers, frontend);
});
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

/** An SSE event as the wire had it (without its blank line), and its id. */
interface RawEvent {
  raw: string;
  id: number | undefined;
}

/** Reads a response's SSE events as raw text; `stop` true after an event leaves (the connection is closed there). */
async function readEvents(res: Response, controller: AbortController | undefined, stop: (e: RawEvent) => boolean = () => false): Promise<RawEvent[]> {
  const events: RawEvent[] = [];
  await sseEvents(
    res,
    (raw) => {
      const id = /^id: (\d+)$/m.exec(raw)?.[1];
      const e = { raw, id: id === undefined ? undefined : Number(id) };
      events.push(e);
      return stop(e);
    },
    { controller },
  );
  return events;
}

/** A client that will resume its stream says so: only then is it kept. */
const KEPT = { 'content-type': 'application/json', 'x-ebb-resumable': '1' };

function post(path: string, body: unknown, controller?: AbortController): Promise<Response> {
  return fetch(`${frontend.url}${path}`, { method: 'POST', headers: KEPT, body: JSON.stringify(body), signal: controller?.signal });
}

/** Resolves once the worker has nothing in flight (its status, asked until it says so; bounded). */
async function workerIdle(w: WorkerHandle): Promise<void> {
  await bounded(
    (async () => {
      while ((await call('GET', `${w.systemUrl}/engine/status`)).body.inflight_requests !== 0) await sleep(20);
    })(),
    `${w.workerId} to have nothing in flight`,
  );
}

const chat = (maxTokens: number, seed: number) => ({ model: 'm1', messages: [{ role: 'user', content: 'tell me about the tides' }], max_tokens: maxTokens, seed, stream: true });
const idOf = (events: RawEvent[]) => (JSON.parse(events[0]!.raw.split('data: ')[1]!) as { id: string }).id;
const textOf = (events: RawEvent[]) =>
  events
    .map((e) => e.raw.split('data: ')[1]!)
    .filter((d) => d !== '[DONE]')
    .map((d) => (JSON.parse(d) as { choices: Array<{ delta?: { content?: string } }> }).choices[0]?.delta?.content ?? '')
    .join('');

describe('resumable streams: one frontend, kept in memory', () => {
  it('a client cut after 20 tokens resumes where it stopped: the events it missed byte for byte, one [DONE], the text of an undisturbed run', async () => {
    const cut = new AbortController();
    const first = await readEvents(await post('/v1/chat/completions', chat(60, 1), cut), cut, (e) => e.id === 20);
    assert.equal(first.at(-1)!.id, 20);
    const id = idOf(first);
    const rest = await readEvents(await fetch(`${frontend.url}/v1/chat/completions/${id}?stream=true&starting_after=20`), undefined);
    assert.equal(rest[0]!.id, 21, 'from the event after the last one the client had');
    assert.equal(rest.filter((e) => e.raw.endsWith('data: [DONE]')).length, 1, 'exactly one end');
    // The whole stream, replayed: what the cut client had, then what the resume sent.
    const whole = await readEvents(await fetch(`${frontend.url}/v1/chat/completions/${id}?stream=true`), undefined);
    assert.deepEqual([...first, ...rest].map((e) => e.raw), whole.map((e) => e.raw));
    assert.deepEqual(whole.map((e) => e.id), whole.map((_, i) => i), 'ids number the events from 0');
    // Last-Event-ID (what EventSource sends) means the same as starting_after.
    const fromHeader = await readEvents(await fetch(`${frontend.url}/v1/chat/completions/${id}?stream=true`, { headers: { 'last-event-id': '40' } }), undefined);
    assert.deepEqual(fromHeader.map((e) => e.raw), whole.slice(41).map((e) => e.raw));
    const undisturbed = await readEvents(await post('/v1/chat/completions', chat(60, 1)), undefined);
    assert.equal(textOf(whole), textOf(undisturbed));
    assert.equal(textOf(whole).split(' ').length, 60);
  });

  it('a second client following a live stream gets the same events as the first, from where it joined', async () => {
    const res = await post('/v1/chat/completions', chat(40, 2));
    let joined: Promise<RawEvent[]> | undefined;
    const original = await readEvents(res, undefined, (e) => {
      if (e.id === 5) joined = fetch(`${frontend.url}/v1/chat/completions/${idOf([e])}?stream=true&starting_after=5`).then((r) => readEvents(r, undefined));
      return false;
    });
    assert.ok(joined);
    assert.deepEqual((await joined).map((e) => e.raw), original.slice(6).map((e) => e.raw));
  });

  it('the Responses API through the openai SDK: responses.retrieve(id, { stream, starting_after }) after a cut', async () => {
    const client = new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'unused', maxRetries: 0, defaultHeaders: { 'x-ebb-resumable': '1' } });
    const stream = await client.responses.create({ model: 'm1', input: 'tell me about the tides', max_output_tokens: 30, stream: true });
    let id = '';
    let last = -1;
    let text = '';
    for await (const e of stream) {
      if (e.type === 'response.created') id = e.response.id;
      if (e.type === 'response.output_text.delta') text += e.delta;
      last = e.sequence_number;
      if (last === 10) break; // the SDK closes the connection
    }
    const types: string[] = [];
    let final: OpenAI.Responses.Response | undefined;
    for await (const e of await client.responses.retrieve(id, { stream: true, starting_after: last })) {
      types.push(e.type);
      assert.ok(e.sequence_number > last, `${e.sequence_number} after ${last}`);
      if (e.type === 'response.output_text.delta') text += e.delta;
      if (e.type === 'response.incomplete' || e.type === 'response.completed') final = e.response;
    }
    assert.equal(types.filter((t) => t === 'response.incomplete').length, 1, 'one end');
    const message = final?.output[0] as { content: Array<{ text: string }> } | undefined;
    assert.equal(message?.content[0]?.text, text, 'the text cut and resumed is the whole text');
    assert.equal(final?.usage?.output_tokens, 30);
  });

  it('unknown ids: 404 response_not_found; a completion\'s resume needs stream=true (a chat completion without it is a stored one); a bad starting_after is a 400', async () => {
    const unknown = await call('GET', `${frontend.url}/v1/chat/completions/chatcmpl-nope?stream=true`);
    assert.equal(unknown.status, 404);
    assert.equal(unknown.body.error.code, 'response_not_found');
    assert.equal((await call('GET', `${frontend.url}/v1/completions/chatcmpl-x?stream=true`)).body.error.code, 'response_not_found');
    assert.equal((await call('GET', `${frontend.url}/v1/completions/cmpl-x`)).status, 400);
    assert.equal((await call('GET', `${frontend.url}/v1/chat/completions/chatcmpl-x`)).body.error.code, 'response_not_found', 'no stored completion of that id');
    assert.equal((await call('GET', `${frontend.url}/v1/chat/completions/chatcmpl-x?stream=true&starting_after=abc`)).status, 400);
    assert.ok((await metricValue(frontend.url, 'ebb_frontend_stream_resumes_total', 'outcome="not_found"')) >= 2);
  });

  it('1,000 clients following one stream all get it whole', async () => {
    const agent = new Agent({ connections: 1000 });
    const res = await post('/v1/chat/completions', chat(30, 3));
    let followers: Promise<RawEvent[][]> | undefined;
    const original = await readEvents(res, undefined, (e) => {
      if (e.id === 2) followers = Promise.all(Array.from({ length: 1000 }, () => undiciFetch(`${frontend.url}/v1/chat/completions/${idOf([e])}?stream=true&starting_after=2`, { dispatcher: agent }).then((r) => readEvents(r as unknown as Response, undefined))));
      return false;
    });
    const expected = original.slice(3).map((e) => e.raw);
    const all = await followers!;
    // Their 1,000 connections go with them: none is left idle in the suite's pool for a later request to be sent on as the frontend closes it.
    await agent.close();
    assert.equal(all.length, 1000);
    for (const got of all) assert.deepEqual(got.map((e) => e.raw), expected);
  });
});

describe('which streams are kept: those whose client will resume them', () => {
  it('a plain stream (no x-ebb-resumable) costs nothing extra: no event ids, not resumable, and its client leaving frees its worker at once', async () => {
    const cut = new AbortController();
    const res = await fetch(`${frontend.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(chat(100_000, 31)), signal: cut.signal });
    assert.equal(res.headers.get('x-ebb-resumable'), null, 'not said to be resumable');
    const servedBy = workers.find((w) => w.workerId === res.headers.get('x-ebb-worker-id'))!;
    const mark = frontend.mark();
    const first = await readEvents(res, cut, (e) => e.raw.includes('"content":"') && !e.raw.includes('"role"'));
    assert.ok(first.every((e) => e.id === undefined), 'no event carries an id');
    // No grace: the worker's slot is freed once the client is gone (well before the 15 s resume grace).
    await workerIdle(servedBy);
    assert.ok(!frontend.logs.slice(mark).some((l) => l.event === 'stream_abandoned'), 'not kept, so never abandoned after a grace');
    const resume = await call('GET', `${frontend.url}/v1/chat/completions/${idOf(first)}?stream=true`);
    assert.equal(resume.status, 404);
    assert.equal(resume.body.error.code, 'response_not_found');
  });

  it('a kept stream says so (x-ebb-resumable: 1); --keep-streams all keeps every stream, asked or not', async () => {
    const kept = await post('/v1/chat/completions', chat(3, 32));
    assert.equal(kept.headers.get('x-ebb-resumable'), '1');
    await kept.text();
    const all = await startFrontend(discovery, ['--keep-streams', 'all']);
    started.push(all);
    await frontendSeesWorkers(all, 2);
    const plain = await fetch(`${all.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(chat(5, 33)) });
    assert.equal(plain.headers.get('x-ebb-resumable'), '1');
    const events = await readEvents(plain, undefined);
    const again = await readEvents(await fetch(`${all.url}/v1/chat/completions/${idOf(events)}?stream=true`), undefined);
    assert.deepEqual(again.map((e) => e.raw), events.map((e) => e.raw));
  });

  it('starting_after -1 is the whole stream; an event past the end of an ended stream is a 400 naming starting_after, not an empty 200', async () => {
    const whole = await readEvents(await post('/v1/chat/completions', chat(5, 34)), undefined);
    const id = idOf(whole);
    const fromStart = await readEvents(await fetch(`${frontend.url}/v1/chat/completions/${id}?stream=true&starting_after=-1`), undefined);
    assert.deepEqual(fromStart.map((e) => e.raw), whole.map((e) => e.raw));
    const last = whole.at(-1)!.id!;
    const atEnd = await fetch(`${frontend.url}/v1/chat/completions/${id}?stream=true&starting_after=${last}`);
    assert.equal(atEnd.status, 200);
    assert.equal(await atEnd.text(), '', 'after its last event: nothing more');
    const past = await call('GET', `${frontend.url}/v1/chat/completions/${id}?stream=true&starting_after=${last + 5}`);
    assert.equal(past.status, 400);
    assert.equal(past.body.error.param, 'starting_after');
  });

  it('stored responses are bounded in bytes too: large inputs push the oldest out, and the gauge counts them', async () => {
    const small = await startFrontend(discovery, ['--stream-store-max-bytes', '1500000']);
    started.push(small);
    await frontendSeesWorkers(small, 2);
    const client = new OpenAI({ baseURL: `${small.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    const big = 'tide '.repeat(60_000);
    const ids: string[] = [];
    for (let i = 0; i < 8; i++) ids.push((await client.responses.create({ model: 'm1', input: big, max_output_tokens: 1 })).id);
    const bytes = await metricValue(small.url, 'ebb_frontend_response_store_bytes');
    assert.ok(bytes > 0 && bytes <= 1_500_000, `the records' bytes are counted and bounded: ${bytes}`);
    await assert.rejects(client.responses.retrieve(ids[0]!), (err: unknown) => err instanceof OpenAI.NotFoundError, 'the oldest is forgotten');
    assert.equal((await client.responses.retrieve(ids.at(-1)!)).id, ids.at(-1));
  });
});

describe('resumable streams: a client that leaves and does not come back', () => {
  it('its generation runs on for the grace, then is cancelled (the worker freed, the waste metered); a late resume is a 404 response_expired', async () => {
    const short = await startFrontend(discovery, ['--resume-grace-ms', '300']);
    started.push(short);
    await frontendSeesWorkers(short, 2);
    const cut = new AbortController();
    const res = await fetch(`${short.url}/v1/chat/completions`, { method: 'POST', headers: KEPT, body: JSON.stringify(chat(100_000, 4)), signal: cut.signal });
    const servedBy = workers.find((w) => w.workerId === res.headers.get('x-ebb-worker-id'))!;
    const mark = short.mark();
    const first = await readEvents(res, cut, (e) => e.id === 3);
    const abandoned = await short.waitForEvent('stream_abandoned', (l) => l.response_id === idOf(first), { after: mark });
    assert.ok((abandoned.unfollowed_events as number) > 0, 'events were generated with nobody following');
    // The worker's slot is freed: its in-flight count reaches 0.
    await workerIdle(servedBy);
    const late = await call('GET', `${short.url}/v1/chat/completions/${idOf(first)}?stream=true&starting_after=3`);
    assert.equal(late.status, 404);
    assert.equal(late.body.error.code, 'response_expired');
    assert.equal(await metricValue(short.url, 'ebb_frontend_streams_abandoned_total'), 1);
    assert.ok((await metricValue(short.url, 'ebb_frontend_abandoned_stream_events_total')) > 0);
  });
});

describe('the Responses API keeps its responses: background, retrieve, cancel, store, previous_response_id', () => {
  const client = () => new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'unused', maxRetries: 0, defaultHeaders: { 'x-ebb-resumable': '1' } });

  it('background: answered queued at once, runs with no client, its events followed later from starting_after, its object retrieved completed', async () => {
    const c = client();
    const queued = await c.responses.create({ model: 'm1', input: 'tell me about the tides', max_output_tokens: 40, background: true });
    assert.equal(queued.status, 'queued');
    assert.equal(queued.background, true);
    // Nobody is connected; a client comes for the events after the first 5, and gets the rest and one end.
    const seen: number[] = [];
    let text = '';
    let end: OpenAI.Responses.Response | undefined;
    for await (const e of await c.responses.retrieve(queued.id, { stream: true, starting_after: 5 })) {
      seen.push(e.sequence_number);
      if (e.type === 'response.output_text.delta') text += e.delta;
      if (e.type === 'response.incomplete') end = e.response;
    }
    assert.equal(seen[0], 6);
    assert.ok(end, 'the stream ends with the response');
    const done = await c.responses.retrieve(queued.id);
    assert.equal(done.status, 'incomplete', 'max_output_tokens reached');
    assert.equal(done.usage?.output_tokens, 40);
    assert.ok(done.output_text.endsWith(text), 'the events after 5 are the end of its text');
  });

  it('background and streamed: events from response.created (queued) on, each numbered; the client leaves, the response runs on, and starting_after gives the rest as an undisturbed run has them', async () => {
    const c = client();
    const request = { model: 'm1', input: 'tell me about the tides', max_output_tokens: 30, background: true, stream: true } as const;
    type Event = { type: string; sequence_number: number; delta?: string; response?: { id: string; status: string } };
    const first: Event[] = [];
    for await (const e of await c.responses.create(request)) {
      first.push(e as Event);
      if (e.type === 'response.output_text.delta' && first.length >= 8) break; // the client leaves
    }
    assert.deepEqual(first.slice(0, 3).map((e) => [e.type, e.response?.status]), [['response.created', 'queued'], ['response.queued', 'queued'], ['response.in_progress', 'in_progress']]);
    assert.deepEqual(first.map((e) => e.sequence_number), first.map((_, i) => i), 'numbered from 0, one by one');
    const id = first[0]!.response!.id;
    const rest: Event[] = [];
    for await (const e of await c.responses.retrieve(id, { stream: true, starting_after: first.at(-1)!.sequence_number })) rest.push(e as Event);
    const whole: Event[] = [];
    for await (const e of await c.responses.retrieve(id, { stream: true })) whole.push(e as Event);
    assert.deepEqual([...first, ...rest], whole, 'what the client had, then the rest: the response\'s every event once');
    const undisturbed: Event[] = [];
    for await (const e of await c.responses.create(request)) undisturbed.push(e as Event);
    const kinds = (events: Event[]) => events.map((e) => [e.type, e.sequence_number, e.delta ?? null]);
    assert.deepEqual(kinds(whole), kinds(undisturbed), 'as an undisturbed run: the same events, the same text');
    assert.equal(whole.at(-1)!.type, 'response.incomplete');
    assert.equal((await c.responses.retrieve(id)).status, 'incomplete', 'it ran to its end with nobody connected');
  });

  it('a background stream its worker refuses before it starts ends with that refusal as its last event, and its object says failed', async () => {
    const c = client();
    // A token id past the mocker's tokenizer: the field policy lets it through, the worker refuses it before any token.
    const events: Array<{ type: string; code?: string; message?: string; response?: { id: string } }> = [];
    await assert.rejects(
      (async () => {
        const stream = await c.responses.create({ model: 'm1', input: 'tides', background: true, stream: true, logit_bias: { '2000000': 1 } } as OpenAI.Responses.ResponseCreateParamsStreaming);
        for await (const e of stream) events.push(e as never);
      })(),
      (err: unknown) => err instanceof OpenAI.APIError && /logit_bias/.test(err.message),
    );
    assert.deepEqual(events.map((e) => e.type), ['response.created', 'response.queued'], 'its announcement, then the refusal raised');
    assert.equal((await c.responses.retrieve(events[0]!.response!.id)).status, 'failed');
  });

  it('cancel: a background response stops on its worker at once, and says cancelled', async () => {
    const c = client();
    const queued = await c.responses.create({ model: 'm1', input: 'tell me about the tides', background: true });
    // It is running on a worker: wait for its first events.
    for await (const e of await c.responses.retrieve(queued.id, { stream: true })) if (e.type === 'response.output_text.delta') break;
    const servedBy = await Promise.all(workers.map(async (w) => ({ w, n: (await call('GET', `${w.systemUrl}/engine/status`)).body.inflight_requests as number })));
    const busy = servedBy.find((x) => x.n > 0)!.w;
    const cancelled = await c.responses.cancel(queued.id);
    assert.equal(cancelled.status, 'cancelled');
    await workerIdle(busy);
    assert.equal((await c.responses.retrieve(queued.id)).status, 'cancelled');
    const foreground = await c.responses.create({ model: 'm1', input: 'x', max_output_tokens: 2 });
    await assert.rejects(c.responses.cancel(foreground.id), (err: unknown) => err instanceof OpenAI.BadRequestError && /only background responses/.test(err.message));
  });

  it('previous_response_id: the stored input and output are the next turn\'s prefix; store false is not kept', async () => {
    const c = client();
    const first = await c.responses.create({ model: 'm1', input: 'tell me about the tides', max_output_tokens: 8 });
    const second = await c.responses.create({ model: 'm1', input: 'and the moon?', previous_response_id: first.id, max_output_tokens: 4 });
    assert.equal(second.previous_response_id, first.id);
    // The same turn sent whole gives the same answer: the history was the prefix.
    const whole = await secondTurnWhole(c, first.output_text, 4);
    assert.equal(second.output_text, whole.output_text);
    const unstored = await c.responses.create({ model: 'm1', input: 'x', max_output_tokens: 2, store: false });
    await assert.rejects(c.responses.retrieve(unstored.id), (err: unknown) => err instanceof OpenAI.NotFoundError);
    await assert.rejects(
      c.responses.create({ model: 'm1', input: 'x', previous_response_id: unstored.id }),
      (err: unknown) => err instanceof OpenAI.BadRequestError && /previous_response_id/.test(err.message),
    );
  });
});
