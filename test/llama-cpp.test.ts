/**
 * `--engine llama-cpp` against a real llama.cpp (node-llama-cpp's CPU prebuilt) and a tiny GGUF
 * model generated at start: the worker contract with real processes, tokenizer usage, sampling,
 * continuation, structured output, and the whole system through `ebb up` and the openai SDK.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import OpenAI from 'openai';
import { getLlama, resolveChatWrapper, type Llama, type LlamaModel, type Token } from 'node-llama-cpp';
import { loadLlamaCppEngine, type LlamaCppEngine, type LlamaCppOptions } from '../src/engine/llama-cpp.js';
import type { GenerateRequest } from '../src/engine/engine.js';
import type { TokenLogprob } from '../src/protocol/request-plane.js';
import type { EbbError } from '../src/protocol/errors.js';
import { createLogger } from '../src/common/logger.js';
import { call, openLineStream } from './helpers/http.js';
import { assertTokenLogprob, textLines } from './helpers/logprobs.js';
import { writeTinyLlamaGguf } from './helpers/gguf.js';
import { drainGeneration } from './helpers/generation.js';
import { spawnEbb, START_BOUND_MS, tempDiscoveryUrl, workerReady, type EbbProcess, type WorkerHandle } from './helpers/processes.js';

const modelPath = writeTinyLlamaGguf();
const MODEL = 'tiny';
/** One thread, CPU only, a small context: fast on a busy 2-core machine. */
const LLAMA = ['--engine', 'llama-cpp', '--model-path', modelPath, '--model', MODEL, '--threads', '1', '--gpu', 'off', '--context-size', '2048'];
const PROMPT = 'hello world, tell me about the tides';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

/** Started, then waited for: a worker that never gets ready (a loaded machine) is still stopped at the end. */
async function llamaWorker(args: string[] = [], discovery = tempDiscoveryUrl()): Promise<WorkerHandle> {
  const p = spawnEbb(['worker', '--port', '0', '--system-port', '0', '--discovery', discovery, ...LLAMA, ...args], 'worker');
  started.push(p);
  return workerReady(p);
}

const gen = (w: WorkerHandle, body: Record<string, unknown> = {}) =>
  openLineStream(`${w.requestUrl}/generate`, { model: MODEL, prompt: PROMPT, temperature: 0, max_tokens: 20, ...body });

interface Summary {
  text: string;
  ids: number[];
  /** Tokens delivered, counted from the token ids of the pieces (a piece can carry several). */
  tokens: number;
  pieces: Array<{ text: string; token_ids: number[]; logprobs?: TokenLogprob[] }>;
  last: any;
}

function summarise(lines: string[]): Summary {
  const parsed = lines.map((l) => JSON.parse(l));
  const pieces = parsed.filter((p) => typeof p.text === 'string');
  const ids = pieces.flatMap((p) => p.token_ids as number[]);
  return { text: pieces.map((p) => p.text).join(''), ids, tokens: ids.length, pieces, last: parsed.at(-1) };
}

describe('llama-cpp worker: the worker contract with a real engine', () => {
  it('drains while 5 streams run: draining with 5 in flight, every token delivered, then drained', async () => {
    const w = await llamaWorker(['--parallel', '5']);
    const streams = await Promise.all(Array.from({ length: 5 }, (_, i) => gen(w, { prompt: `${PROMPT} ${i}`, max_tokens: 300 })));
    await Promise.all(streams.map((s) => s.first));
    const drain = await call('POST', `${w.systemUrl}/engine/drain`);
    assert.equal(drain.status, 202);
    assert.equal(drain.body.state, 'draining');
    assert.equal(drain.body.inflight_requests, 5);
    assert.equal(drain.body.engine.running_sequences, 5, 'five llama.cpp sequences in one context');
    const late = await call('POST', `${w.requestUrl}/generate`, { model: MODEL, prompt: 'late' });
    assert.equal(late.status, 503);
    assert.equal(late.body.error.code, 'worker_draining');

    for (const s of streams) {
      const { tokens, last } = summarise(await s.done);
      assert.equal(tokens, 300);
      assert.equal(last.done, true);
      assert.equal(last.finish_reason, 'length');
      assert.equal(last.usage.completion_tokens, 300);
    }
    await w.waitForEvent('state_changed', (l) => l.to === 'drained');
    const status = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(status.body.state, 'drained');
    assert.equal(status.body.inflight_requests, 0);
    assert.equal(status.body.engine.running_sequences, 0);
    assert.equal(status.body.engine.sequences_free, 5, 'every sequence went back to the context');
  });

  it('frees the sequence of a client that disconnects mid-stream, and drains', async () => {
    const w = await llamaWorker();
    const s = await gen(w, { max_tokens: 2000 });
    await s.first;
    const before = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(before.body.inflight_requests, 1);
    assert.equal(before.body.engine.running_sequences, 1);
    s.abort();
    const drain = await call('POST', `${w.systemUrl}/engine/drain`);
    if (drain.body.state !== 'drained') await w.waitForEvent('state_changed', (l) => l.to === 'drained');
    const status = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(status.body.state, 'drained');
    assert.equal(status.body.engine.running_sequences, 0);
    assert.equal(status.body.engine.sequences_free, 4);
    assert.ok(status.body.engine.generated_tokens < 2000, `generation stopped with the client (${status.body.engine.generated_tokens} tokens)`);
    const metrics = await fetch(`${w.systemUrl}/metrics`).then((r) => r.text());
    assert.match(metrics, /ebb_worker_requests_total\{outcome="dropped"\} 1/);
  });

  it('on SIGTERM lets in-flight streams finish, refuses new work, then exits 0', async () => {
    const w = await llamaWorker(['--parallel', '3', '--shutdown-grace-ms', '200']);
    const streams = await Promise.all([0, 1, 2].map((i) => gen(w, { prompt: `${PROMPT} ${i}`, max_tokens: 300 })));
    await Promise.all(streams.map((s) => s.first));
    w.signal('SIGTERM');
    await w.waitForEvent('shutdown_started');
    const late = await call('POST', `${w.requestUrl}/generate`, { model: MODEL, prompt: 'late' });
    assert.equal(late.status, 503);
    assert.equal(late.body.error.code, 'worker_draining');
    for (const s of streams) {
      const { tokens, last } = summarise(await s.done);
      assert.equal(tokens, 300);
      assert.equal(last.done, true);
    }
    assert.equal(await w.exitCode(), 0);
  });

  it('at the drain timeout hands off what still runs (a terminal line naming its tokens), stops the sequence, exits 0', async () => {
    const w = await llamaWorker(['--shutdown-grace-ms', '0', '--drain-timeout-ms', '300']);
    const s = await gen(w, { max_tokens: 2000, request_id: 'long-one' });
    await s.first;
    w.signal('SIGTERM');
    const { tokens, last } = summarise(await s.done);
    // The line names the sequence's exported KV, held for the next worker: a caller that does not
    // continue the stream releases it, or the shutdown waits for it (up to --kv-transfer-ttl-ms).
    const kv = await call('DELETE', `${w.requestUrl}/kv/${last.handoff?.kv?.transfer_id}`);
    assert.equal(kv.status, 204, 'the hand-off named a pending KV state');
    assert.equal(await w.exitCode(), 0, 'README: a handed-off stream is not lost, the exit code is 0');
    assert.ok(tokens > 0 && tokens < 2000, `cut short: ${tokens} tokens`);
    assert.equal(last.handoff?.reason, 'drain_deadline');
    assert.equal(last.handoff?.completion_tokens, tokens, 'naming exactly the tokens it delivered');
    const stages = Object.fromEntries(w.logs.filter((l) => l.event === 'shutdown_stage').map((l) => [l.stage, l.outcome]));
    assert.equal(stages.wait_inflight, 'timed_out');
    assert.equal(stages.handoff, 'completed', 'the engine confirmed idle after the hand-off');
    assert.equal(stages.cut_inflight, 'skipped');
  });

  it('exits non-zero with one line naming the file when the model cannot load', async () => {
    // A download cut short: the header and metadata are fine, the tensor data is not all there.
    const bad = join(dirname(modelPath), 'truncated.gguf');
    writeFileSync(bad, readFileSync(modelPath).subarray(0, 300_000));
    const p = spawnEbb(['worker', '--port', '0', '--system-port', '0', '--discovery', tempDiscoveryUrl(), ...LLAMA, '--model-path', bad], 'worker');
    started.push(p);
    assert.equal(await p.exitCode(), 1);
    const lines = p.stderr.filter((l) => l.trim() !== '');
    const line = lines.find((l) => l.includes(bad));
    assert.ok(line !== undefined, `a line naming ${bad}: ${lines.join(' | ')}`);
    assert.match(line, /cannot load model .*corrupted or incomplete/);
    assert.ok(!p.logs.some((l) => l.event === 'worker_ready'), 'never registered');
  });
});

describe('llama-cpp worker: tokenizer, sampling, continuation', () => {
  let w: WorkerHandle;
  let llama: Llama;
  let vocab: LlamaModel;
  before(async () => {
    [w, llama] = await Promise.all([llamaWorker(), getLlama({ gpu: false, build: 'never', skipDownload: true, progressLogs: false, maxThreads: 1 })]);
    vocab = await llama.loadModel({ modelPath, vocabOnly: true });
  });
  after(async () => {
    await vocab?.dispose();
    await llama?.dispose();
  });

  it('counts usage with the model tokenizer, not words', async () => {
    const res = await call('POST', `${w.requestUrl}/generate`, { model: MODEL, prompt: PROMPT, max_tokens: 12, temperature: 0, stream: false });
    assert.equal(res.status, 200);
    const expected = vocab.tokenize(PROMPT).length + 1; // + BOS
    assert.notEqual(expected, PROMPT.split(/\s+/).length, 'the prompt is chosen so tokens and words differ');
    assert.equal(res.body.usage.prompt_tokens, expected);
    assert.equal(res.body.usage.completion_tokens, 12);

    const streamed = summarise(await (await gen(w, { max_tokens: 12 })).done);
    assert.equal(streamed.tokens, 12);
    assert.equal(streamed.last.usage.completion_tokens, 12);
    assert.equal(streamed.last.usage.prompt_tokens, expected);
    assert.equal(vocab.detokenize(streamed.ids as Token[]).trimStart(), streamed.text.trimStart(), 'the ids are the tokens of the text');
    assert.equal(streamed.text, res.body.text, 'temperature 0: streamed or not, the same text');
  });

  it('renders chat requests with the chat template the GGUF carries (usage counts the rendered prompt)', async () => {
    const messages = [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hello there' }];
    const res = await call('POST', `${w.requestUrl}/generate`, { model: MODEL, messages, max_tokens: 4, temperature: 0, stream: false });
    assert.equal(res.status, 200);
    const wrapper = resolveChatWrapper(vocab);
    assert.equal(wrapper?.wrapperName, 'ChatML', 'the tiny model carries a ChatML template');
    const rendered = wrapper!.generateContextState({ chatHistory: [{ type: 'system', text: 'be brief' }, { type: 'user', text: 'hello there' }, { type: 'model', response: [] }] });
    const templated = rendered.contextText.tokenize(vocab.tokenizer).length;
    const joined = vocab.tokenize(messages.map((m) => `${m.role}: ${m.content}`).join('\n')).length + 1;
    assert.notEqual(templated, joined, 'the template is not the joined prompt');
    assert.equal(res.body.usage.prompt_tokens, templated);
  });

  it('is deterministic at temperature 0 and for a seed, and a different seed differs', async () => {
    const once = (body: Record<string, unknown>) =>
      call('POST', `${w.requestUrl}/generate`, { model: MODEL, prompt: PROMPT, max_tokens: 16, stream: false, ...body }).then((r) => r.body.text as string);
    assert.equal(await once({ temperature: 0 }), await once({ temperature: 0 }));
    const seven = await once({ temperature: 0.9, seed: 7 });
    assert.equal(await once({ temperature: 0.9, seed: 7 }), seven);
    assert.notEqual(await once({ temperature: 0.9, seed: 8 }), seven);
  });

  it('continues from token ids exactly: at temperature 0 the text equals an undisturbed run, and so do the logprobs', async () => {
    const whole = summarise(await (await gen(w, { max_tokens: 24, logprobs: true, top_logprobs: 2 })).done);
    assert.equal(whole.tokens, 24);
    // Cut at a piece boundary past 10 tokens: what a frontend relayed before the worker went away.
    let k = 0;
    let n = 0;
    while (n < 10) n += (whole.pieces[k++] as { token_ids: number[] }).token_ids.length;
    const sent = whole.pieces.slice(0, k);
    const continuation = { text: sent.map((p) => p.text).join(''), completion_tokens: n, token_ids: sent.flatMap((p) => p.token_ids) };
    const rest = summarise(await (await gen(w, { max_tokens: 24 - n, continuation, logprobs: true, top_logprobs: 2 })).done);
    assert.equal(continuation.text + rest.text, whole.text);
    assert.deepEqual([...continuation.token_ids, ...rest.ids], whole.ids);
    // The continued positions' distributions: the same tokens, the same values (to float noise: the
    // prefix was evaluated in other batches than the undisturbed run's).
    const continued = rest.pieces.flatMap((p) => p.logprobs!);
    const undisturbed = whole.pieces.slice(k).flatMap((p) => p.logprobs!);
    assert.equal(continued.length, 24 - n);
    continued.forEach((e, i) => {
      const u = undisturbed[i]!;
      assert.deepEqual([e.token, e.top_logprobs.map((t) => t.token)], [u.token, u.top_logprobs.map((t) => t.token)], `continued token ${i}`);
      assert.ok(Math.abs(e.logprob - u.logprob) < 1e-3, `continued token ${i}: logprob ${e.logprob}, undisturbed ${u.logprob}`);
    });
    assert.equal(rest.last.usage.completion_tokens, 24 - n, 'only this worker\'s tokens are counted');
  });

  it('reports logprobs from llama.cpp: one per token, finite and <= 0, alternatives sorted; at temperature 0 the chosen token is the most likely', async () => {
    const lines = await (await gen(w, { max_tokens: 16, logprobs: true, top_logprobs: 4 })).done;
    const pieces = textLines(lines);
    const plain = summarise(await (await gen(w, { max_tokens: 16 })).done);
    assert.equal(pieces.map((p) => p.text).join(''), plain.text, 'asking for logprobs does not change the answer');
    const entries = pieces.flatMap((p, i) => {
      assert.equal(p.logprobs?.length, p.token_ids?.length, `piece ${i}: one entry per token id`);
      return p.logprobs!;
    });
    assert.equal(entries.length, 16);
    const spelling = vocab.fileInfo.metadata.tokenizer.ggml.tokens;
    let byteTokens = 0;
    entries.forEach((e, i) => {
      assertTokenLogprob(e, 4, `token ${i}`, { ownBytes: true });
      const id = plain.ids[i] as Token;
      assert.equal(e.token, vocab.detokenize([id], false, plain.ids.slice(Math.max(0, i - 4), i) as Token[]), `token ${i}: its text`);
      // A byte-fallback token is part of a character: its text alone is U+FFFD, its bytes the one it stands for.
      const hex = /^<0x([0-9A-F]{2})>$/.exec(spelling[id] ?? '')?.[1];
      if (hex !== undefined) byteTokens++;
      assert.deepEqual(e.bytes, hex !== undefined ? [parseInt(hex, 16)] : [...Buffer.from(e.token, 'utf8')], `token ${i} (${spelling[id]}): its bytes`);
      // Greedy sampling takes the most likely token: its logprob heads the alternatives.
      assert.ok(Math.abs((e.top_logprobs[0] as { logprob: number }).logprob - e.logprob) < 1e-6, `token ${i}: chosen ${e.logprob}, most likely ${e.top_logprobs[0]?.logprob}`);
    });
    assert.ok(byteTokens > 0, 'the answer has byte-fallback tokens (the tiny model writes them often): their bytes were checked');
    const chosenOnly = textLines(await (await gen(w, { max_tokens: 16, logprobs: true })).done).flatMap((p) => p.logprobs!);
    assert.equal(chosenOnly.length, 16);
    chosenOnly.forEach((e, i) => {
      assertTokenLogprob(e, 0, `top_logprobs 0, token ${i}`, { ownBytes: true });
      assert.ok(Math.abs(e.logprob - (entries[i] as { logprob: number }).logprob) < 1e-5, `token ${i}: the chosen token's probability alone (${e.logprob}) is the one the full distribution gave (${entries[i]?.logprob})`);
    });
    const whole = await call('POST', `${w.requestUrl}/generate`, { model: MODEL, prompt: PROMPT, temperature: 0, max_tokens: 16, logprobs: true, top_logprobs: 4, stream: false });
    assert.equal(whole.status, 200);
    assert.deepEqual(whole.body.logprobs, entries, 'a non-streamed answer collects the same entries');
  });

  it('refuses continuation token ids outside the vocabulary (llama.cpp would abort the process) and keeps serving', async () => {
    const bad = await call('POST', `${w.requestUrl}/generate`, {
      model: MODEL,
      prompt: PROMPT,
      max_tokens: 4,
      stream: false,
      continuation: { text: 'x', completion_tokens: 1, token_ids: [999_999] },
    });
    assert.equal(bad.status, 400);
    assert.equal(bad.body.error.code, 'invalid_request');
    assert.match(bad.body.error.message, /token id 999999 is not in this model's vocabulary/);
    const ok = await call('POST', `${w.requestUrl}/generate`, { model: MODEL, prompt: PROMPT, max_tokens: 2, stream: false });
    assert.equal(ok.status, 200);
  });

  it('honours response_format json_object on the request plane', async () => {
    const res = await call('POST', `${w.requestUrl}/generate`, {
      model: MODEL,
      messages: [{ role: 'user', content: 'Reply in JSON' }],
      max_tokens: 32,
      temperature: 0,
      stream: false,
      response_format: { type: 'json_object' },
    });
    assert.equal(res.status, 200);
    assert.equal(typeof JSON.parse(res.body.text), 'object');
    assert.equal(res.body.finish_reason, 'stop', 'the grammar ended the answer');
  });
});

describe('llama-cpp engine in-process: grammar, chat template, queue, quiescence', () => {
  let engine: LlamaCppEngine;
  const options: LlamaCppOptions = { modelPath, parallel: 1, maxQueue: 1, contextSize: 1024, threads: 1, gpu: 'off' };
  before(async () => {
    engine = await loadLlamaCppEngine(options, createLogger('test'), new AbortController().signal);
  });
  after(async () => {
    await engine?.close();
  });

  const request = (extra: Record<string, unknown> = {}): GenerateRequest =>
    ({ request_id: 'r', prompt: 'user: Reply in JSON', messages: [{ role: 'user', content: 'Reply in JSON' }], max_tokens: 48, temperature: 0, ...extra }) as GenerateRequest;

  const drain = drainGeneration;

  it('declares what it honours, with the context size as max_context', () => {
    assert.deepEqual(engine.capabilities, {
      json_object: true,
      json_schema: true,
      logprobs: true,
      tools: true,
      tool_syntax: { prefix: '||call: ', params_prefix: '(', suffix: ')' },
      max_context: 1024,
      continuation: true,
      prompt_token_ids: true,
      embeddings: true,
      sampling: true,
      preemption: true,
    });
  });

  it('a token-id prompt is evaluated as those ids; an id outside the vocabulary is refused, not a crash', async () => {
    const ids = engine.render({ prompt: 'hello world' }).tokens.map(Number);
    const byIds = await drain(engine.generate(request({ prompt: ids.join(' '), messages: undefined, prompt_token_ids: ids, max_tokens: 8 }), new AbortController().signal));
    const byText = await drain(engine.generate(request({ prompt: 'hello world', messages: undefined, max_tokens: 8 }), new AbortController().signal));
    assert.equal(byIds.text, byText.text, 'the same tokens, the same answer');
    assert.equal(byIds.result.prompt_tokens, ids.length);
    await assert.rejects(drain(engine.generate(request({ prompt: 'x', messages: undefined, prompt_token_ids: [1_000_000] }), new AbortController().signal)), /outside this model's vocabulary/);
  });

  it('json_object and json_schema answers parse (and match the schema)', async () => {
    const obj = await drain(engine.generate(request({ response_format: { type: 'json_object' } }), new AbortController().signal));
    assert.equal(typeof JSON.parse(obj.text), 'object');
    assert.equal(obj.result.finish_reason, 'stop');
    const schema = { type: 'object', properties: { ok: { type: 'boolean' }, n: { type: 'integer' } }, required: ['ok', 'n'] };
    const typed = await drain(engine.generate(request({ response_format: { type: 'json_schema', json_schema: { name: 'answer', schema } } }), new AbortController().signal));
    const parsed = JSON.parse(typed.text);
    assert.equal(typeof parsed.ok, 'boolean');
    assert.ok(Number.isInteger(parsed.n));
  });

  it('penalties and logit_bias change the temperature-0 answer, top_k 1 and min_p 1 make a sampled one greedy, a continuation samples as the original did, and a logit_bias id past the vocabulary is refused', async () => {
    const signal = new AbortController().signal;
    const plain = { prompt: PROMPT, messages: undefined, max_tokens: 24 };
    const run = (extra: Record<string, unknown>) => drain(engine.generate(request({ ...plain, ...extra }), signal));
    const greedy = await run({});
    const ids = greedy.pieces.flatMap((p) => p.token_ids ?? []);
    assert.ok(ids.length > 0);
    // The first token the greedy answer writes, banned: the answer must change from its first token on.
    const banned = await run({ sampling: { logit_bias: { [String(ids[0])]: -100 } } });
    assert.notEqual(banned.pieces[0]?.token_ids?.[0], ids[0], 'logit_bias -100 bans the token');
    const forced = await run({ sampling: { logit_bias: { [String(ids.at(-1))]: 100 } } });
    assert.ok(forced.pieces.flatMap((p) => p.token_ids ?? []).every((id) => id === ids.at(-1)), 'logit_bias 100 makes that token every token');
    const repeated = ids.length - new Set(ids).size;
    if (repeated > 0) {
      // A random tiny model's greedy answer repeats itself: penalties on what it already wrote change it.
      for (const sampling of [{ frequency_penalty: 2 }, { presence_penalty: 2 }, { repetition_penalty: 2 }]) assert.notEqual((await run({ sampling })).text, greedy.text, JSON.stringify(sampling));
    }
    assert.equal((await run({ temperature: 1, seed: 9, sampling: { top_k: 1 } })).text, greedy.text, 'top_k 1 is greedy');
    assert.equal((await run({ temperature: 1, seed: 9, sampling: { min_p: 1 } })).text, greedy.text, 'min_p 1 is greedy');

    // Continued from its first pieces (8 tokens or so), a penalised answer goes on as it did on one engine (its tokens count for the penalties).
    const sampling = { frequency_penalty: 1.5, presence_penalty: 0.5, repetition_penalty: 1.3 };
    const whole = await run({ sampling });
    const wholeIds = whole.pieces.flatMap((p) => p.token_ids ?? []);
    const first = whole.pieces.slice(0, whole.pieces.findIndex((_, i) => whole.pieces.slice(0, i + 1).flatMap((p) => p.token_ids ?? []).length >= 8) + 1);
    const head = first.flatMap((p) => p.token_ids ?? []);
    const continuation = { text: first.map((p) => p.text).join(''), completion_tokens: head.length, token_ids: head };
    const rest = await run({ sampling, max_tokens: 24 - head.length, continuation });
    assert.deepEqual(rest.pieces.flatMap((p) => p.token_ids ?? []), wholeIds.slice(head.length));

    await assert.rejects(engine.check(request({ ...plain, sampling: { logit_bias: { '99999999': 1 } } })), (err: EbbError) => err.code === 'invalid_request' && err.param === 'logit_bias');
  });

  it('logprobs under a grammar list only the tokens it allows', async () => {
    const g = engine.generate(request({ response_format: { type: 'json_object' }, logprobs: 5 }), new AbortController().signal);
    const entries = [];
    for (let step = await g.next(); !step.done; step = await g.next()) entries.push(...(step.value.logprobs ?? []));
    assert.ok(entries.length > 0);
    entries.forEach((e, i) => assertTokenLogprob(e, 5, `token ${i}`, { ownBytes: true, exactTop: false }));
    const first = entries[0]!.top_logprobs;
    assert.ok(first.length > 0 && first.length < 5, `a JSON object opens with "{" alone: ${first.length} candidates`);
    for (const c of first) assert.equal(c.token.trim(), '{', `candidate ${JSON.stringify(c.token)} opens the object`);
  });

  it('renders chat messages with the chat template the GGUF carries', () => {
    const chat = engine.render({ prompt: 'user: hi', messages: [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hi' }] });
    const plain = engine.render({ prompt: 'user: hi' });
    const IM_START = 3; // the tiny model's <|im_start|>
    assert.equal(chat.tokens.filter((t) => t === IM_START).length, 3, 'system, user and the opened assistant turn');
    assert.ok(!plain.tokens.includes(IM_START as Token), 'a plain prompt is tokenized as it is');
    assert.ok(chat.stopTokens.has(4), 'the template ends the answer at <|im_end|>');
  });

  it('queues past --parallel, reports overload past the queue bound, and reports idle by event', async () => {
    const first = new AbortController();
    const a = engine.generate(request({ prompt: 'a', messages: undefined, max_tokens: 1000 }), first.signal);
    await a.next(); // running: holds the only sequence
    const second = new AbortController();
    const b = engine.generate(request({ prompt: 'b', messages: undefined, max_tokens: 2 }), second.signal);
    const bDone = drain(b);
    // b reaches the queue through microtasks only (render and tokenize are synchronous): one turn suffices.
    await new Promise<void>((resolve) => setImmediate(resolve));
    assert.equal(engine.stats().queued_sequences, 1);
    assert.equal(engine.isOverloaded(), true, 'a full queue is an overload (worker_overloaded)');
    assert.deepEqual(await engine.probeQuiescence(), { state: 'busy', waiting_for: ['engine: 1 running, 1 queued sequences'] });

    const idle = new Promise<void>((resolve) => {
      const off = engine.onQuiescenceChange(() => {
        void engine.probeQuiescence().then((q) => {
          if (q.state === 'idle') {
            off();
            resolve();
          }
        });
      });
    });
    first.abort(new Error('client gone'));
    await assert.rejects(a.next(), /client gone/);
    const bResult = await bDone;
    assert.equal(bResult.result.completion_tokens, 2, 'the queued request ran once the sequence was free');
    await idle;
    assert.equal(engine.isOverloaded(), false);
    assert.equal(engine.stats().running_sequences, 0);
  });

  it('fails to load with one line naming the file: missing, or a garbage header (which would hang node-llama-cpp)', async () => {
    const load = (path: string) => loadLlamaCppEngine({ ...options, modelPath: path }, createLogger('test'), new AbortController().signal);
    const missing = join(dirname(modelPath), 'missing.gguf');
    await assert.rejects(load(missing), { message: `cannot load model ${missing}: no such file` });
    const garbage = join(dirname(modelPath), 'garbage.gguf');
    const header = Buffer.alloc(64, 0xff);
    header.write('GGUF', 0, 'latin1');
    writeFileSync(garbage, header);
    await assert.rejects(load(garbage), { message: `cannot load model ${garbage}: unsupported GGUF version 4294967295 (llama.cpp reads versions 2 and 3)` });
  });

  it('stops loading when its signal aborts', async () => {
    const stop = new AbortController();
    stop.abort(new Error('SIGTERM during loading'));
    await assert.rejects(loadLlamaCppEngine(options, createLogger('test'), stop.signal), { message: 'SIGTERM during loading' });
  });
});

describe('ebb up --engine llama-cpp: the whole system through the openai SDK', () => {
  it('streams chat, answers completions, honours json_object, and penalties and logit_bias', async () => {
    const up = spawnEbb(
      ['up', '--engine', 'llama-cpp', '--model-path', modelPath, '--workers', '1', '--port', '0', '--threads', '1', '--gpu', 'off', '--context-size', '2048', '--discovery', tempDiscoveryUrl()],
      'up',
    );
    started.push(up);
    const worker = await up.waitForEvent('worker_ready', undefined, { boundMs: START_BOUND_MS });
    const front = await up.waitForEvent('frontend_ready', undefined, { boundMs: START_BOUND_MS });
    await up.waitForLog(
      (l) => (l.event === 'discovery_reset' && (l.workers as string[]).includes(worker.worker_id as string)) || (l.event === 'worker_added' && l.worker_id === worker.worker_id),
      'the frontend routes to the worker',
    );
    assert.equal(worker.model, 'tiny-llama', 'the model is named after the GGUF file');
    const client = new OpenAI({ baseURL: `${front.url as string}/v1`, apiKey: 'unused', maxRetries: 0 });
    assert.deepEqual((await client.models.list()).data.map((m) => m.id), ['tiny-llama']);

    const stream = await client.chat.completions.create({
      model: 'tiny-llama',
      messages: [{ role: 'user', content: 'Say hello' }],
      max_tokens: 12,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let chunks = 0;
    let finish: string | null | undefined;
    let usage: OpenAI.CompletionUsage | null | undefined;
    for await (const chunk of stream) {
      const delta = chunk.choices[0]?.delta?.content;
      if (delta) chunks++;
      text += delta ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
      usage = chunk.usage ?? usage;
    }
    assert.ok(chunks > 1 && text.length > 0, 'streamed in pieces');
    assert.equal(finish, 'length');
    assert.equal(usage?.completion_tokens, 12);

    const completion = await client.completions.create({ model: 'tiny-llama', prompt: PROMPT, max_tokens: 5, temperature: 0 });
    assert.equal(completion.usage?.completion_tokens, 5);
    assert.ok(completion.usage !== undefined && completion.usage.prompt_tokens > 1);

    const json = await client.chat.completions.create({
      model: 'tiny-llama',
      messages: [{ role: 'user', content: 'Reply in JSON' }],
      max_tokens: 32,
      temperature: 0,
      response_format: { type: 'json_object' },
    });
    const content = json.choices[0]?.message.content ?? '';
    assert.equal(typeof JSON.parse(content), 'object', `parseable JSON: ${content}`);

    // Penalties and a logit_bias (a token the model's tokenizer has, pushed to be every token): 200 on chat, completions and
    // Responses, and at temperature 0 another text than without them.
    const llama = await getLlama({ gpu: false, build: 'never', skipDownload: true, progressLogs: false, maxThreads: 1 });
    const vocab = await llama.loadModel({ modelPath, vocabOnly: true });
    const pushed = vocab.tokenize(' tide', false).at(-1)!;
    await vocab.dispose();
    await llama.dispose();
    const fields = { frequency_penalty: 1, presence_penalty: 0.5, logit_bias: { [String(pushed)]: 100 } };
    const chat = (extra: object) =>
      client.chat.completions.create({ model: 'tiny-llama', messages: [{ role: 'user', content: 'Say hello' }], max_tokens: 8, temperature: 0, ...extra }).then((r) => r.choices[0]?.message.content ?? '');
    assert.notEqual(await chat(fields), await chat({}));
    const complete = (extra: object) => client.completions.create({ model: 'tiny-llama', prompt: PROMPT, max_tokens: 8, temperature: 0, ...extra }).then((r) => r.choices[0]?.text ?? '');
    assert.notEqual(await complete(fields), await complete({}));
    const respond = (extra: object) =>
      client.responses.create({ model: 'tiny-llama', input: 'Say hello', max_output_tokens: 8, temperature: 0, ...extra } as OpenAI.Responses.ResponseCreateParamsNonStreaming).then((r) => r.output_text);
    assert.notEqual(await respond(fields), await respond({}));

    up.signal('SIGTERM');
    assert.equal(await up.exitCode(), 0);
  });
});
