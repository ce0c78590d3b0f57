/**
 * logprobs on the request plane: a worker's /generate with `logprobs` / `top_logprobs` answers each
 * token's logprob with its alternatives (on its stream lines, or collected in a non-streamed
 * answer), and a worker whose engine cannot report them refuses the request naming the field.
 * The mocker's here; llama-cpp's and --engine openai's with their engines' tests.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { call, openLineStream } from './helpers/http.js';
import { assertTokenLogprob, textLines } from './helpers/logprobs.js';
import OpenAI from 'openai';
import { startFleet, startWorker, tempDiscoveryUrl, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';

const PROMPT = 'tell me about the tides';

describe('mocker worker: logprobs', () => {
  let w: WorkerHandle;
  before(async () => {
    w = await startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'm1', '--mocker-itl-ms', '0', '--mocker-ttft-ms', '0']);
  });
  after(async () => {
    await w?.stop();
  });

  const stream = async (body: Record<string, unknown>) => (await (await openLineStream(`${w.requestUrl}/generate`, { model: 'm1', prompt: PROMPT, ...body })).done);

  it('gives each token its logprob and top_logprobs alternatives, deterministic, streamed or not', async () => {
    const lines = await stream({ max_tokens: 12, logprobs: true, top_logprobs: 5 });
    const pieces = textLines(lines);
    assert.equal(pieces.length, 12);
    pieces.forEach((p, i) => {
      assert.equal(p.logprobs?.length, 1, `piece ${i}: one entry, for its one token`);
      const e = p.logprobs![0]!;
      assert.equal(e.token, p.text, `piece ${i}: the entry is the token's`);
      assertTokenLogprob(e, 5, `piece ${i}`);
    });
    assert.ok(pieces.some((p) => p.logprobs![0]!.top_logprobs[0]!.token === p.text), 'the chosen word is usually the most likely');
    assert.ok(new Set(pieces.map((p) => p.logprobs![0]!.logprob)).size > 1, 'logprobs differ by position');
    assert.deepEqual(await stream({ max_tokens: 12, logprobs: true, top_logprobs: 5 }), lines, 'the same request, the same lines');

    const whole = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: PROMPT, max_tokens: 12, logprobs: true, top_logprobs: 5, stream: false });
    assert.equal(whole.status, 200);
    assert.deepEqual(whole.body.logprobs, pieces.flatMap((p) => p.logprobs), 'a non-streamed answer collects them');

    const zero = textLines(await stream({ max_tokens: 12, logprobs: true }));
    zero.forEach((p, i) => assertTokenLogprob(p.logprobs![0]!, 0, `top_logprobs 0, piece ${i}`));
    assert.deepEqual(zero.map((p) => p.logprobs![0]!.logprob), pieces.map((p) => p.logprobs![0]!.logprob), 'the same values without alternatives');
  });

  it('a continuation yields the same logprobs for its positions as the undisturbed run', async () => {
    const whole = textLines(await stream({ max_tokens: 10, logprobs: true, top_logprobs: 3, seed: 4 }));
    const sent = whole.slice(0, 4);
    const continuation = { text: sent.map((p) => p.text).join(''), completion_tokens: sent.length };
    const rest = textLines(await stream({ max_tokens: 6, logprobs: true, top_logprobs: 3, seed: 4, continuation }));
    assert.equal(rest.length, 6);
    assert.deepEqual(rest, whole.slice(4), 'text and logprobs of positions 4..9 as in the undisturbed run');
  });

  it('leaves lines without logprobs exactly as they were: {"text":...}', async () => {
    const lines = await stream({ max_tokens: 3 });
    for (const l of lines.slice(0, 3)) assert.match(l, /^\{"text":"[^"]*"\}$/);
    const off = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: PROMPT, max_tokens: 3, logprobs: false, stream: false });
    assert.equal(off.status, 200);
    assert.equal('logprobs' in off.body, false, 'logprobs false: none collected');
  });

  it('refuses top_logprobs over 20 (the request plane\'s bound)', async () => {
    const res = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: PROMPT, max_tokens: 3, logprobs: true, top_logprobs: 21 });
    assert.equal(res.status, 400);
    assert.deepEqual([res.body.error.code, res.body.error.param], ['integer_above_max_value', 'top_logprobs']);
    assert.match(res.body.error.message, /^Invalid 'top_logprobs': integer above maximum value\. Expected a value <= 20, but got 21 instead\.$/);
  });
});

/** Through the frontend, as the openai SDK asks and reads them (its types: ChatCompletionTokenLogprob). */
describe('frontend: logprobs through the openai SDK', () => {
  let frontend: FrontendHandle;
  let workers: WorkerHandle[];
  before(async () => {
    ({ frontend, workers } = await startFleet(2, ['--mocker-itl-ms', '25', '--mocker-ttft-ms', '0']));
  });
  after(async () => {
    await Promise.all([frontend, ...workers].map((p) => p?.stop()));
  });
  const client = () => new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  const request = { model: 'm1', messages: [{ role: 'user' as const, content: PROMPT }], max_tokens: 10, logprobs: true, top_logprobs: 3, temperature: 0 };

  it('chat: logprobs.content per token, the same streamed and not; top_logprobs alone is a 400', async () => {
    const plain = await client().chat.completions.create(request);
    const content = plain.choices[0]!.logprobs!.content!;
    assert.equal(content.length, 10);
    assert.equal(content.map((e) => e.token).join(''), plain.choices[0]!.message.content);
    content.forEach((e, i) => assertTokenLogprob(e, 3, `token ${i}`));
    const streamed: unknown[] = [];
    for await (const chunk of await client().chat.completions.create({ ...request, stream: true })) streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
    assert.deepEqual(streamed, content);
    await assert.rejects(client().chat.completions.create({ ...request, logprobs: false }), (err: unknown) => err instanceof OpenAI.BadRequestError && /top_logprobs needs logprobs/.test(err.message));
    const none = await client().chat.completions.create({ ...request, logprobs: false, top_logprobs: undefined });
    assert.equal(none.choices[0]!.logprobs, null);
  });

  it('completions: the legacy shape (tokens, token_logprobs, top_logprobs maps, text_offset)', async () => {
    const r = await client().completions.create({ model: 'm1', prompt: PROMPT, max_tokens: 6, logprobs: 2 });
    const lp = r.choices[0]!.logprobs!;
    assert.equal(lp.tokens!.join(''), r.choices[0]!.text);
    assert.equal(lp.token_logprobs!.length, 6);
    assert.ok(lp.top_logprobs!.every((m) => Object.keys(m).length <= 2 && Object.values(m).every((v) => v <= 0)));
    assert.deepEqual(lp.text_offset, lp.tokens!.map((_, i) => lp.tokens!.slice(0, i).join('').length));
  });

  it('a stream whose worker is SIGKILLed half way: the logprobs of every token, delivered and continued, as undisturbed', async () => {
    const reference = (await client().chat.completions.create({ ...request, max_tokens: 16 })).choices[0]!.logprobs!.content!;
    const mark = frontend.mark();
    const { data, response } = await client().chat.completions.create({ ...request, max_tokens: 16, stream: true }).withResponse();
    const servedBy = workers.find((w) => w.workerId === response.headers.get('x-ebb-worker-id'))!;
    const got: unknown[] = [];
    for await (const chunk of data) {
      got.push(...(chunk.choices[0]?.logprobs?.content ?? []));
      if (got.length === 5) servedBy.proc.kill('SIGKILL');
    }
    await frontend.waitForEvent('stream_migrated', () => true, { after: mark });
    assert.deepEqual(got, reference);
  });
});
