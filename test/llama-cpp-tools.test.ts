/**
 * Tool calling on `--engine llama-cpp`: a worker on the tiny random-weights GGUF (ChatML, which
 * node-llama-cpp's ChatML wrapper writes calls for as `||call: name({...})`) behind a frontend,
 * driven with the openai SDK. Random weights never choose to call a tool, so what is tested is the
 * forced call the engine writes itself: its opening as text, the name under a grammar of the tool
 * names, the arguments under the function's JSON Schema, the suffix; and a stream moved in the
 * middle of it going on to the same call.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import type { ChatCompletionMessageParam, ChatCompletionTool, ChatCompletionToolChoiceOption } from 'openai/resources/chat/completions';
import { getLlama, type Llama, type LlamaModel } from 'node-llama-cpp';
import { loadLlamaCppEngine, type LlamaCppEngine } from '../src/engine/llama-cpp.js';
import { createLogger } from '../src/common/logger.js';
import { call, openLineStream } from './helpers/http.js';
import { writeTinyLlamaGguf } from './helpers/gguf.js';
import { frontendSeesWorkers, spawnEbb, startFrontend, tempDiscoveryUrl, workerReady, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';

const modelPath = writeTinyLlamaGguf();
const MODEL = 'tiny';
/** The call syntax of node-llama-cpp's ChatML wrapper, as the worker must declare it. */
const CHATML_SYNTAX = { prefix: '||call: ', params_prefix: '(', suffix: ')' };

// maxLength: random weights never close a string on their own. node-llama-cpp's JSON Schema
// grammar does not bound numbers (minimum, maximum), so the schemas ask nothing of them here.
const weather: ChatCompletionTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 10 }, days: { type: 'integer' }, unit: { type: 'string', enum: ['c', 'f'] } }, required: ['city', 'days', 'unit'] },
  },
};
const time: ChatCompletionTool = { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: { tz: { type: 'string', enum: ['UTC', 'CET'] } }, required: ['tz'] } } };
const ask: ChatCompletionMessageParam[] = [{ role: 'user', content: 'what is the weather in Paris, and the time?' }];
const NAMED: ChatCompletionToolChoiceOption = { type: 'function', function: { name: 'get_weather' } };

/** Arguments valid for their tool's schema: JSON, every required property there with its type. */
function assertArgs(name: string, args: string): void {
  const parsed = JSON.parse(args) as Record<string, unknown>;
  if (name === 'get_weather') {
    assert.equal(typeof parsed.city, 'string', args);
    assert.ok((parsed.city as string).length <= 10, `city within maxLength: ${args}`);
    assert.ok(Number.isInteger(parsed.days), `days an integer: ${args}`);
    assert.ok(parsed.unit === 'c' || parsed.unit === 'f', `unit from its enum: ${args}`);
  } else {
    assert.equal(name, 'get_time');
    assert.ok(parsed.tz === 'UTC' || parsed.tz === 'CET', `tz from its enum: ${args}`);
  }
}

type Call = { id: string; name: string; arguments: string };
const callsOf = (m: OpenAI.ChatCompletionMessage): Call[] => (m.tool_calls ?? []).map((c) => ({ id: c.id, name: c.type === 'function' ? c.function.name : '', arguments: c.type === 'function' ? c.function.arguments : '' }));

const started: EbbProcess[] = [];
let worker: WorkerHandle;
let frontend: FrontendHandle;
before(async () => {
  const discovery = tempDiscoveryUrl();
  // Started, then waited for: a worker that never gets ready is still stopped at the end.
  const p = spawnEbb(['worker', '--port', '0', '--system-port', '0', '--discovery', discovery, '--engine', 'llama-cpp', '--model-path', modelPath, '--model', MODEL, '--threads', '1', '--gpu', 'off', '--context-size', '2048', '--parallel', '1'], 'worker');
  started.push(p);
  worker = await workerReady(p);
  frontend = await startFrontend(discovery);
  started.push(frontend);
  await frontendSeesWorkers(frontend, 1);
});
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

const client = () => new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'unused', maxRetries: 0 });

/** The same request answered whole and streamed: the same calls (ids included), finish_reason tool_calls both ways. */
async function forcedCall(tools: ChatCompletionTool[], tool_choice: ChatCompletionToolChoiceOption): Promise<{ calls: Call[]; message: OpenAI.ChatCompletionMessage }> {
  const request = { model: MODEL, messages: ask, tools, tool_choice, temperature: 0, max_tokens: 200 };
  const plain = await client().chat.completions.create(request);
  const choice = plain.choices[0]!;
  assert.equal(choice.finish_reason, 'tool_calls', `the call ended the answer: ${JSON.stringify(choice.message)}`);
  assert.equal(choice.message.content, null, 'only a call: content is null');
  const calls = callsOf(choice.message);
  assert.equal(calls.length, 1, `one forced call: ${JSON.stringify(calls)}`);
  assertArgs(calls[0]!.name, calls[0]!.arguments);

  const stream = client().chat.completions.stream(request);
  let argumentPieces = 0;
  stream.on('chunk', (chunk) => {
    for (const d of chunk.choices[0]?.delta.tool_calls ?? []) if (d.function?.arguments) argumentPieces++;
  });
  const final = await stream.finalChatCompletion();
  assert.deepEqual(callsOf(final.choices[0]!.message), calls, 'streamed: the same call');
  assert.equal(final.choices[0]!.finish_reason, 'tool_calls');
  assert.ok(argumentPieces > 1, `the arguments streamed in pieces (${argumentPieces})`);
  return { calls, message: choice.message };
}

describe('llama-cpp tool calling through the frontend (openai SDK)', () => {
  it('the worker declares tools, with its chat wrapper\'s call syntax', async () => {
    const adminUrl = (await frontend.waitForEvent('frontend_ready')).admin_url as string;
    const entry = (await call('GET', `${adminUrl}/workers/${worker.workerId}`)).body;
    assert.equal(entry.engine, 'llama-cpp');
    assert.equal(entry.capabilities.tools, true);
    assert.deepEqual(entry.capabilities.tool_syntax, CHATML_SYNTAX);
  });

  it('tool_choice naming a function: a call to it with schema-valid arguments, then its result answered', async () => {
    const { calls, message } = await forcedCall([weather, time], NAMED);
    assert.equal(calls[0]!.name, 'get_weather');
    // The result goes back in a tool message; the model answers in text.
    const answer = await client().chat.completions.create({
      model: MODEL,
      messages: [...ask, message, { role: 'tool', tool_call_id: calls[0]!.id, content: '12 degrees' }],
      tools: [weather, time],
      tool_choice: 'none',
      temperature: 0,
      max_tokens: 5,
    });
    assert.equal(answer.choices[0]!.message.tool_calls, undefined);
    assert.equal(answer.choices[0]!.finish_reason, 'length');
    assert.ok((answer.choices[0]!.message.content ?? '').length > 0);
  });

  it('tool_choice required: one of several tools chosen by name under a grammar of their names; with one tool, that one', async () => {
    const { calls } = await forcedCall([weather, time], 'required');
    assert.ok(['get_weather', 'get_time'].includes(calls[0]!.name), calls[0]!.name);
    const only = await forcedCall([time], 'required');
    assert.equal(only.calls[0]!.name, 'get_time');
  });
});

describe('llama-cpp forced call: a continuation goes on under the call\'s grammars', () => {
  const body = { model: MODEL, messages: ask, tools: [weather, time], tool_choice: 'required', temperature: 0, max_tokens: 200 };
  type Piece = { text: string; token_ids: number[] };

  async function undisturbed(): Promise<Piece[]> {
    const s = await openLineStream(`${worker.requestUrl}/generate`, { ...body, stream: true });
    return (await s.done).map((l) => JSON.parse(l)).filter((p) => typeof p.text === 'string');
  }

  const CALL = /^\|\|call: (get_weather|get_time)\((\{.*\})\)$/;

  it('cut in the name, in the arguments, or after the suffix: the same call from token ids, a valid one from text only', async () => {
    const pieces = await undisturbed();
    const whole = pieces.map((p) => p.text).join('');
    assert.match(whole, CALL);
    const nameEnd = pieces.findIndex((p) => p.text === '(');
    assert.ok(nameEnd > 2, `the name was sampled in pieces before the params prefix: ${JSON.stringify(pieces.map((p) => p.text))}`);
    // In the name, right after it, in the arguments, after the whole call.
    for (const cut of [2, nameEnd, nameEnd + 3, pieces.length]) {
      const head = pieces.slice(0, cut);
      const text = head.map((p) => p.text).join('');
      const ids = head.flatMap((p) => p.token_ids);
      const what = `cut after piece ${cut}: ${JSON.stringify(text)}`;
      const exact = await call('POST', `${worker.requestUrl}/generate`, { ...body, stream: false, max_tokens: 200 - ids.length, continuation: { text, completion_tokens: ids.length, token_ids: ids } });
      assert.equal(exact.status, 200, JSON.stringify(exact.body));
      assert.equal(text + exact.body.text, whole, what);
      assert.equal(exact.body.finish_reason, 'stop');
      // Text only is tokenized again (other tokens than were sampled, so another answer may follow), still under the grammars.
      const retokenized = await call('POST', `${worker.requestUrl}/generate`, { ...body, stream: false, max_tokens: 200 - ids.length, continuation: { text, completion_tokens: ids.length } });
      assert.equal(retokenized.status, 200, JSON.stringify(retokenized.body));
      const [, name, args] = CALL.exec(text + retokenized.body.text) ?? assert.fail(`${what}: not a call: ${JSON.stringify(retokenized.body.text)}`);
      assertArgs(name!, args!);
      assert.equal(retokenized.body.finish_reason, 'stop');
    }
  });

  it('logprobs: one entry per token, the tokens the engine wrote certain (logprob 0, their only alternative)', async () => {
    const s = await openLineStream(`${worker.requestUrl}/generate`, { ...body, stream: true, logprobs: true, top_logprobs: 2 });
    const pieces = (await s.done).map((l) => JSON.parse(l)).filter((p) => typeof p.text === 'string') as Array<Piece & { logprobs: Array<{ logprob: number; top_logprobs: unknown[] }> }>;
    for (const p of pieces) assert.equal(p.logprobs.length, p.token_ids.length, `a logprob per token: ${JSON.stringify(p)}`);
    const written = [pieces[0]!, pieces.find((p) => p.text === '(')!, pieces.at(-1)!];
    assert.deepEqual(written.map((p) => p.text), ['||call: ', '(', ')'], 'the opening, the params prefix, the suffix');
    for (const p of written) for (const e of p.logprobs) assert.deepEqual([e.logprob, e.top_logprobs.length], [0, 1], JSON.stringify(p));
    const sampled = pieces.slice(1, -1).filter((p) => p.text !== '(').flatMap((p) => p.logprobs);
    assert.ok(sampled.every((e) => e.logprob <= 0 && e.top_logprobs.length > 0), 'the name and the arguments: as sampled');
  });

  it('a continuation that is not the forced call, or calls another function, is a 400 invalid_request', async () => {
    const text = await call('POST', `${worker.requestUrl}/generate`, { ...body, continuation: { text: 'hello', completion_tokens: 1 } });
    assert.equal(text.status, 400, JSON.stringify(text.body));
    assert.equal(text.body.error.code, 'invalid_request');
    assert.match(text.body.error.message, /does not start with the forced call/);
    const other = await call('POST', `${worker.requestUrl}/generate`, { ...body, tool_choice: { type: 'function', function: { name: 'get_time' } }, continuation: { text: '||call: get_weather({"ci', completion_tokens: 8 } });
    assert.equal(other.status, 400, JSON.stringify(other.body));
    assert.match(other.body.error.message, /calls "get_weather", which tool_choice does not allow/);
    const badArgs = await call('POST', `${worker.requestUrl}/generate`, { ...body, continuation: { text: '||call: get_time({"zone', completion_tokens: 8 } });
    assert.equal(badArgs.status, 400, JSON.stringify(badArgs.body));
    assert.match(badArgs.body.error.message, /does not follow the parameters of tool "get_time"/);
  });
});

describe('llama-cpp prompt: tools and earlier calls rendered by node-llama-cpp\'s chat wrapper', () => {
  let engine: LlamaCppEngine;
  let llama: Llama;
  let model: LlamaModel;
  before(async () => {
    engine = await loadLlamaCppEngine({ modelPath, parallel: 1, maxQueue: 1, contextSize: 2048, threads: 1, gpu: 'off' }, createLogger('test'), new AbortController().signal);
    llama = await getLlama({ gpu: false, build: 'never', skipDownload: true });
    model = await llama.loadModel({ modelPath, gpuLayers: 0 });
  });
  after(async () => {
    await engine?.close();
    await model?.dispose();
    await llama?.dispose();
  });

  it('documents the tools, renders a call as the model wrote it with its result, and goes on in that response', () => {
    const args = '{"city": "Paris",  "days": 2, "unit": "c"}';
    const { tokens } = engine.render({
      prompt: '',
      messages: [
        { role: 'user', content: 'weather in Paris?' },
        { role: 'assistant', content: '', tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: args } }] },
        { role: 'tool', content: '12 degrees', tool_call_id: 'call_1' },
      ],
      tools: [weather as never],
      tool_choice: 'auto',
    });
    // Spaces around the wrapper's special-token pieces ("(", ")", "\n") are the tiny SentencePiece model's word-start marks.
    const text = model.detokenize(tokens, true).replace(/ (?=[()\n])/g, '');
    assert.match(text, /function get_weather\(params: \{[^}]*city: string,\s*days: \w+,\s*unit: "c" \| "f"\s*\}\);/, `the function documented in the system prompt: ${text}`);
    // The arguments' own text (two spaces kept), the result, and no end of turn after it: the answer goes on.
    assert.ok(text.endsWith(`assistant\n||call: get_weather(${args})\n||result: "12 degrees"\n`), JSON.stringify(text.slice(-200)));
    const none = model.detokenize(engine.render({ prompt: '', messages: [{ role: 'user', content: 'hi' }], tools: [weather as never], tool_choice: 'none' }).tokens, true);
    assert.ok(!none.includes('get_weather'), 'tool_choice none: no tools in the prompt');
  });

  it('a forced call\'s pieces: each one\'s token ids are its text (what the engine wrote included), so a continuation from ids is exact', async () => {
    const g = engine.generate(
      { request_id: 'r', prompt: '', messages: [{ role: 'user', content: 'weather?' }], tools: [weather as never, time as never], tool_choice: 'required', max_tokens: 200, temperature: 0 },
      new AbortController().signal,
    );
    const { tokens: before } = engine.render({ prompt: '', messages: [{ role: 'user', content: 'weather?' }], tools: [weather as never, time as never], tool_choice: 'required' });
    let context = before.map(Number);
    let text = '';
    for (let step = await g.next(); !step.done; step = await g.next()) {
      const piece = step.value;
      assert.equal(model.detokenize(piece.token_ids as never, true, context.slice(-4) as never), piece.text, `after ${JSON.stringify(text)}`);
      context = [...context, ...piece.token_ids!];
      text += piece.text;
    }
    assert.match(text, /^\|\|call: get_(weather|time)\(\{.*\}\)$/);
  });
});

describe('llama-cpp with tools: special tokens are the answer\'s text (calls written in them, as <tool_call> syntaxes are)', () => {
  // A model that writes its <|im_start|> control token often: without tools it is dropped from the text.
  const chatty = writeTinyLlamaGguf({ logitBias: { '<|im_start|>': 6 } });
  let engine: LlamaCppEngine;
  before(async () => {
    engine = await loadLlamaCppEngine({ modelPath: chatty, parallel: 1, maxQueue: 1, contextSize: 2048, threads: 1, gpu: 'off' }, createLogger('test'), new AbortController().signal);
  });
  after(async () => {
    await engine?.close();
  });

  async function answer(extra: Record<string, unknown>): Promise<string> {
    const g = engine.generate({ request_id: 'r', prompt: 'user: hi', messages: [{ role: 'user', content: 'hi' }], max_tokens: 40, temperature: 0, ...extra }, new AbortController().signal);
    let text = '';
    for (let step = await g.next(); !step.done; step = await g.next()) text += step.value.text;
    return text;
  }

  it('with tools the control token is written out; without them, or under tool_choice none, it is not', async () => {
    assert.match(await answer({ tools: [time], tool_choice: 'auto' }), /<\|im_start\|>/);
    assert.doesNotMatch(await answer({}), /<\|im_start\|>/);
    assert.doesNotMatch(await answer({ tools: [time], tool_choice: 'none' }), /<\|im_start\|>/);
  });
});
