import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import OpenAI from 'openai';
import { startEngineSim, type EngineSim } from './helpers/engine-sim.js';
import { spawnWorker, startFrontend, tempDiscoveryUrl, workerReady, type EbbProcess, type FrontendHandle } from './helpers/processes.js';

/**
 * ebb's own conformance test (issue 44 item 7): the openai SDK (the version package-lock.json pins)
 * through every endpoint ebb serves, with full-parameter bodies. Every request field the SDK's own
 * type declarations name is classified here, and each is shown to be honoured (its effect seen),
 * carried to the engine (a simulated vLLM receives it), mapped (to what ebb has), echoed, accepted
 * with no effect on the answer (bookkeeping), or refused with a 400 naming it: none is silently
 * ignored, and a field a newer SDK adds fails the classification until it is given a row. Then the
 * error shapes every SDK error class reads.
 */
const started: EbbProcess[] = [];
let vllm: EngineSim;
let frontend: FrontendHandle;
const KEY = 'sk-conformance';
before(async () => {
  const discovery = tempDiscoveryUrl();
  vllm = await startEngineSim({ kind: 'vllm', itlMs: 0, usage: true });
  const spawned = [
    spawnWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '1', '--mocker-ttft-ms', '0']),
    spawnWorker(['--discovery', discovery, '--model', 'vllm-m', '--engine', 'openai', '--engine-kind', 'vllm', '--engine-url', vllm.url]),
  ];
  started.push(...spawned);
  await Promise.all(spawned.map(workerReady));
  const keys = join(mkdtempSync(join(tmpdir(), 'ebb-keys-')), 'keys');
  writeFileSync(keys, `${KEY}\n`, { mode: 0o600 });
  frontend = await startFrontend(discovery, ['--api-key-file', keys]);
  started.push(frontend);
  await frontend.waitForEvent('discovery_reset', (l) => (l.workers as string[]).length === 2);
});
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
  await vllm?.close();
});

const client = (apiKey = KEY) => new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey, maxRetries: 0 });

/** The property names of one of the SDK's request parameter interfaces, read from its declarations. */
function sdkFields(file: string, iface: string): string[] {
  const sdk = dirname(createRequire(import.meta.url).resolve('openai'));
  const text = readFileSync(join(sdk, file), 'utf8');
  const start = text.indexOf(`export interface ${iface} `);
  assert.ok(start >= 0, `${iface} in ${file}`);
  const body = text.slice(start, text.indexOf('\n}\n', start));
  return [...body.matchAll(/^ {4}(\w+)\??:/gm)].map((m) => m[1]!).sort();
}

/**
 * What ebb does with one field, and the value it is probed with (added to the endpoint's base body,
 * with `with` where it needs company):
 * - `honoured`: `check` sees its effect on the answer (`base`: the answer without it);
 * - `engine`: carried to the engine server: the simulated vLLM receives it (as `as`, its name there);
 * - `echoed`: the Responses object says it back;
 * - `accepted`: bookkeeping, no effect on the answer: the text is the base's;
 * - `refused`: a 400 whose param names it.
 */
type Row =
  | { kind: 'honoured'; value: unknown; with?: Record<string, unknown>; check: (got: any, base: any) => void | Promise<void> }
  | { kind: 'engine'; value: unknown; as?: string }
  | { kind: 'echoed'; value: unknown; expect?: unknown }
  | { kind: 'accepted'; value: unknown; with?: Record<string, unknown> }
  | { kind: 'refused'; value: unknown };

const WEATHER = { name: 'weather', description: 'the weather in a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } };
const CLOCK = { name: 'clock', description: 'the time in a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } };
const chatTools = [WEATHER, CLOCK].map((f) => ({ type: 'function', function: f }));
const responsesTools = [WEATHER, CLOCK].map((f) => ({ type: 'function', ...f }));
/** Room for a whole call or JSON answer (the base bodies' budget is short). */
const LONG = { max_tokens: 300 };
const LONG_OUTPUT = { max_output_tokens: 300 };
const SCHEMA = { type: 'object', properties: { tide: { type: 'string' }, height: { type: 'integer' } }, required: ['tide', 'height'], additionalProperties: false };

const chatText = (a: OpenAI.Chat.ChatCompletion) => a.choices[0]!.message.content;
const responseText = (r: OpenAI.Responses.Response) => r.output_text;
/** A streamed answer's chunks, collected. */
async function collect<T>(stream: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of stream) out.push(x);
  return out;
}
const streamedText = (chunks: OpenAI.Chat.ChatCompletionChunk[]) => chunks.map((c) => c.choices[0]?.delta.content ?? '').join('');

/** Sends `row`'s value of `field` on top of `base`, and checks what ebb did with it. */
async function probe(field: string, row: Row, send: (body: Record<string, unknown>) => Promise<any>, base: Record<string, unknown>, baseAnswer: any, text: (a: any) => unknown, engineModel?: string): Promise<void> {
  const what = `${field}=${JSON.stringify(row.value)}`;
  if (row.kind === 'refused') {
    await assert.rejects(send({ ...base, [field]: row.value }), (err: unknown) => {
      assert.ok(err instanceof OpenAI.BadRequestError, `${what}: a 400 (${String(err)})`);
      assert.ok(String(err.param).startsWith(field), `${what}: its param names it (${err.param}: ${err.message})`);
      return true;
    });
    return;
  }
  if (row.kind === 'engine') {
    assert.ok(engineModel !== undefined, `${field}: an engine row needs the engine's model`);
    const before = vllm.seen.length;
    await send({ ...base, model: engineModel, [field]: row.value });
    const sent = vllm.seen.slice(before).find((r) => r.path.startsWith('/v1/'))!.body;
    assert.deepEqual(sent[row.as ?? field], row.value, `${what}: the engine server received it`);
    return;
  }
  const got = await send({ ...base, ...('with' in row ? row.with : {}), [field]: row.value });
  if (row.kind === 'honoured') return void (await row.check(got, baseAnswer));
  if (row.kind === 'echoed') {
    assert.deepEqual(got[field], row.expect ?? row.value, `${what}: echoed`);
    assert.equal(text(got), text(baseAnswer), `${what}: the same answer`);
    return;
  }
  assert.equal(text(got), text(baseAnswer), `${what}: accepted, the answer unchanged`);
}

describe('conformance: the openai SDK through every endpoint, every field honoured, carried, mapped, echoed or refused naming it', () => {
  it('chat.completions.create', async () => {
    const c = client();
    const base = { model: 'm1', messages: [{ role: 'user', content: 'tell me about the tides' }], max_tokens: 12 };
    const send = (body: Record<string, unknown>) => c.chat.completions.create(body as never) as Promise<any>;
    const baseAnswer = await send(base);
    const CHAT: Record<string, Row> = {
      messages: { kind: 'honoured', value: [{ role: 'user', content: 'and what of the moon?' }], check: (got, b) => assert.notEqual(chatText(got), chatText(b)) },
      model: { kind: 'honoured', value: 'm1', check: (got) => assert.equal(got.model, 'm1') },
      audio: { kind: 'refused', value: { voice: 'alloy', format: 'wav' } },
      frequency_penalty: { kind: 'engine', value: 0.5 },
      function_call: { kind: 'honoured', value: { name: 'weather' }, with: { functions: [WEATHER], ...LONG }, check: (got) => assert.deepEqual([got.choices[0].message.function_call?.name, got.choices[0].finish_reason, got.choices[0].message.tool_calls], ['weather', 'function_call', undefined]) },
      functions: { kind: 'honoured', value: [WEATHER], with: LONG, check: (got) => assert.ok(typeof JSON.parse(got.choices[0].message.function_call.arguments).city === 'string', 'the legacy answer: function_call') },
      logit_bias: { kind: 'engine', value: { '42': 7 } },
      logprobs: { kind: 'honoured', value: true, check: (got) => assert.equal(got.choices[0].logprobs.content.length, got.usage.completion_tokens) },
      max_completion_tokens: { kind: 'honoured', value: 3, check: (got) => assert.equal(got.usage.completion_tokens, 3) },
      max_tokens: { kind: 'honoured', value: 3, check: (got) => assert.equal(got.usage.completion_tokens, 3) },
      metadata: { kind: 'honoured', value: { topic: 'tides' }, with: { store: true }, check: async (got) => assert.deepEqual(((await c.chat.completions.retrieve(got.id)) as unknown as { metadata: unknown }).metadata, { topic: 'tides' }) },
      modalities: { kind: 'refused', value: ['text', 'audio'] },
      moderation: { kind: 'refused', value: { model: 'omni-moderation-latest' } },
      n: { kind: 'honoured', value: 40, check: (got) => assert.equal(got.choices.length, 40) },
      parallel_tool_calls: {
        kind: 'honoured',
        value: false,
        with: { tools: chatTools, tool_choice: 'required', ...LONG },
        check: async (got) => {
          assert.equal(got.choices[0].message.tool_calls.length, 1);
          assert.equal((await send({ ...base, tools: chatTools, tool_choice: 'required', parallel_tool_calls: true, ...LONG })).choices[0].message.tool_calls.length, 2);
        },
      },
      prediction: { kind: 'accepted', value: { type: 'content', content: 'the tides rise and fall' } },
      presence_penalty: { kind: 'engine', value: 0.5 },
      prompt_cache_key: { kind: 'accepted', value: 'tides-1' },
      prompt_cache_options: { kind: 'accepted', value: { mode: 'implicit' } },
      prompt_cache_retention: { kind: 'accepted', value: '24h' },
      reasoning_effort: { kind: 'refused', value: 'high' },
      response_format: {
        kind: 'honoured',
        value: { type: 'json_schema', json_schema: { name: 'tide', schema: SCHEMA, strict: true } },
        with: LONG,
        check: (got) => assert.deepEqual(Object.keys(JSON.parse(chatText(got)!)).sort(), ['height', 'tide']),
      },
      safety_identifier: { kind: 'accepted', value: 'user-1' },
      seed: { kind: 'engine', value: 7 },
      service_tier: { kind: 'honoured', value: 'scale', check: (got) => assert.equal(got.service_tier, 'priority', 'scale is ebb\'s priority tier') },
      stop: { kind: 'engine', value: ['tide'] },
      store: { kind: 'honoured', value: true, check: async (got) => assert.deepEqual((await c.chat.completions.retrieve(got.id)).choices, got.choices) },
      stream: { kind: 'honoured', value: true, check: async (got, b) => assert.equal(streamedText(await collect(got)), chatText(b)) },
      stream_options: { kind: 'honoured', value: { include_usage: true }, with: { stream: true }, check: async (got) => assert.equal((await collect<any>(got)).at(-1).usage.completion_tokens, 12) },
      temperature: { kind: 'engine', value: 0.3 },
      tool_choice: { kind: 'honoured', value: { type: 'function', function: { name: 'clock' } }, with: { tools: chatTools, ...LONG }, check: (got) => assert.deepEqual([got.choices[0].message.tool_calls[0].function.name, got.choices[0].finish_reason], ['clock', 'tool_calls']) },
      tools: { kind: 'honoured', value: chatTools, with: LONG, check: (got) => assert.ok(got.choices[0].message.tool_calls.length > 0, 'auto: the mocker calls one') },
      top_logprobs: { kind: 'honoured', value: 2, with: { logprobs: true }, check: (got) => assert.ok(got.choices[0].logprobs.content.every((t: { top_logprobs: unknown[] }) => t.top_logprobs.length === 2)) },
      top_p: { kind: 'engine', value: 0.5 },
      user: { kind: 'accepted', value: 'user-1' },
      verbosity: { kind: 'refused', value: 'high' },
      web_search_options: { kind: 'refused', value: {} },
    };
    assert.deepEqual(Object.keys(CHAT).sort(), sdkFields('resources/chat/completions/completions.d.ts', 'ChatCompletionCreateParamsBase'), 'every field the SDK can send has a row');
    for (const [field, row] of Object.entries(CHAT)) await probe(field, row, send, base, baseAnswer, chatText, 'vllm-m');
    // A full-parameter body: every field ebb takes at once is served.
    const full = await send({
      ...base,
      n: 2,
      seed: 3,
      stop: ['zzz'],
      temperature: 0.7,
      top_p: 0.9,
      frequency_penalty: 0.2,
      presence_penalty: 0.2,
      logit_bias: { '7': 1 },
      logprobs: true,
      top_logprobs: 1,
      max_completion_tokens: 5,
      metadata: { k: 'v' },
      store: true,
      service_tier: 'auto',
      user: 'u',
      prediction: { type: 'content', content: 'x' },
      prompt_cache_key: 'k',
      prompt_cache_retention: '24h',
      safety_identifier: 's',
      tools: chatTools,
      tool_choice: 'auto',
      parallel_tool_calls: true,
      reasoning_effort: 'none',
      verbosity: 'medium',
      modalities: ['text'],
    });
    assert.equal(full.choices.length, 2);
    assert.equal((await c.chat.completions.retrieve(full.id)).id, full.id);
  });

  it('completions.create', async () => {
    const c = client();
    const base = { model: 'm1', prompt: 'tell me about the tides', max_tokens: 12 };
    const send = (body: Record<string, unknown>) => c.completions.create(body as never) as Promise<any>;
    const text = (a: OpenAI.Completions.Completion) => a.choices[0]!.text;
    const baseAnswer = await send(base);
    const COMPLETIONS: Record<string, Row> = {
      model: { kind: 'honoured', value: 'm1', check: (got) => assert.equal(got.model, 'm1') },
      prompt: { kind: 'honoured', value: ['and the moon', 'and the sun'], check: (got) => assert.equal(got.choices.length, 2) },
      best_of: { kind: 'refused', value: 2 },
      echo: { kind: 'refused', value: true },
      frequency_penalty: { kind: 'engine', value: 0.5 },
      logit_bias: { kind: 'engine', value: { '42': 7 } },
      logprobs: { kind: 'honoured', value: 2, check: (got) => assert.equal(got.choices[0].logprobs.tokens.length, got.usage.completion_tokens) },
      max_tokens: { kind: 'honoured', value: 3, check: (got) => assert.equal(got.usage.completion_tokens, 3) },
      n: { kind: 'honoured', value: 3, check: (got) => assert.equal(got.choices.length, 3) },
      presence_penalty: { kind: 'engine', value: 0.5 },
      seed: { kind: 'engine', value: 7 },
      stop: { kind: 'engine', value: ['tide'] },
      stream: { kind: 'honoured', value: true, check: async (got, b) => assert.equal((await collect<any>(got)).map((x) => x.choices[0]?.text ?? '').join(''), text(b)) },
      stream_options: { kind: 'honoured', value: { include_usage: true }, with: { stream: true }, check: async (got) => assert.equal((await collect<any>(got)).at(-1).usage.completion_tokens, 12) },
      suffix: { kind: 'refused', value: 'the end' },
      temperature: { kind: 'engine', value: 0.3 },
      top_p: { kind: 'engine', value: 0.5 },
      user: { kind: 'accepted', value: 'user-1' },
    };
    assert.deepEqual(Object.keys(COMPLETIONS).sort(), sdkFields('resources/completions.d.ts', 'CompletionCreateParamsBase'));
    for (const [field, row] of Object.entries(COMPLETIONS)) await probe(field, row, send, base, baseAnswer, text, 'vllm-m');
    const full = await send({ ...base, n: 2, seed: 1, stop: ['zzz'], temperature: 0.5, top_p: 0.9, frequency_penalty: 0.1, presence_penalty: 0.1, logit_bias: { '3': 1 }, logprobs: 1, user: 'u', best_of: 1, echo: false });
    assert.equal(full.choices.length, 2);
  });

  it('responses.create: the object echoes what it was given', async () => {
    const c = client();
    const base = { model: 'm1', input: 'tell me about the tides', max_output_tokens: 12 };
    const send = (body: Record<string, unknown>) => c.responses.create(body as never) as Promise<any>;
    const baseAnswer = await send(base);
    const earlier = await send({ ...base, input: 'hello' });
    const RESPONSES: Record<string, Row> = {
      background: {
        kind: 'honoured',
        value: true,
        check: async (got, b) => {
          assert.deepEqual([got.status, got.background], ['queued', true]);
          const events = await collect<any>(await c.responses.retrieve(got.id, { stream: true }));
          assert.equal(events.at(-1).response.output_text ?? events.at(-1).response.output[0].content[0].text, responseText(b));
        },
      },
      context_management: { kind: 'refused', value: [{ type: 'compaction', compact_threshold: 1000 }] },
      conversation: { kind: 'refused', value: 'conv_1' },
      include: { kind: 'refused', value: ['message.output_text.logprobs'] },
      input: { kind: 'honoured', value: [{ role: 'user', content: [{ type: 'input_text', text: 'and the moon?' }] }], check: (got, b) => assert.notEqual(responseText(got), responseText(b)) },
      instructions: { kind: 'honoured', value: 'be brief', check: (got, b) => assert.deepEqual([got.instructions, responseText(got) !== responseText(b)], ['be brief', true]) },
      max_output_tokens: { kind: 'honoured', value: 3, check: (got) => assert.deepEqual([got.usage.output_tokens, got.max_output_tokens, got.status], [3, 3, 'incomplete']) },
      metadata: { kind: 'echoed', value: { topic: 'tides' } },
      model: { kind: 'honoured', value: 'm1', check: (got) => assert.equal(got.model, 'm1') },
      moderation: { kind: 'refused', value: { model: 'omni-moderation-latest' } },
      parallel_tool_calls: {
        kind: 'honoured',
        value: false,
        with: { tools: responsesTools, tool_choice: 'required', ...LONG_OUTPUT },
        check: (got) => assert.deepEqual([got.parallel_tool_calls, got.output.filter((o: { type: string }) => o.type === 'function_call').length], [false, 1]),
      },
      previous_response_id: { kind: 'honoured', value: earlier.id, check: (got, b) => assert.deepEqual([got.previous_response_id, responseText(got) !== responseText(b)], [earlier.id, true]) },
      prompt: { kind: 'refused', value: { id: 'pmpt_1' } },
      prompt_cache_key: { kind: 'echoed', value: 'tides-1' },
      prompt_cache_options: { kind: 'accepted', value: { mode: 'implicit' } },
      prompt_cache_retention: { kind: 'echoed', value: '24h' },
      reasoning: { kind: 'refused', value: { effort: 'high' } },
      safety_identifier: { kind: 'echoed', value: 'user-1' },
      service_tier: { kind: 'echoed', value: 'scale', expect: 'priority' },
      store: { kind: 'honoured', value: false, check: async (got) => assert.deepEqual([got.store, await c.responses.retrieve(got.id).then(() => 'kept', (err: unknown) => (err instanceof OpenAI.NotFoundError ? 'not kept' : String(err)))], [false, 'not kept']) },
      stream: { kind: 'honoured', value: true, check: async (got, b) => assert.equal((await collect<any>(got)).filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join(''), responseText(b)) },
      stream_options: { kind: 'honoured', value: { include_obfuscation: false }, with: { stream: true }, check: async (got) => assert.equal((await collect<any>(got)).at(-1).type, 'response.incomplete') },
      temperature: { kind: 'engine', value: 0.3 },
      text: { kind: 'honoured', value: { format: { type: 'json_schema', name: 'tide', schema: SCHEMA, strict: true }, verbosity: 'medium' }, with: LONG_OUTPUT, check: (got) => assert.deepEqual([Object.keys(JSON.parse(responseText(got))).sort(), got.text.verbosity], [['height', 'tide'], 'medium']) },
      tool_choice: { kind: 'honoured', value: { type: 'function', name: 'clock' }, with: { tools: responsesTools, ...LONG_OUTPUT }, check: (got) => assert.equal(got.output.find((o: { type: string }) => o.type === 'function_call').name, 'clock') },
      tools: { kind: 'honoured', value: responsesTools, with: LONG_OUTPUT, check: (got) => assert.ok(got.output.some((o: { type: string }) => o.type === 'function_call')) },
      top_logprobs: { kind: 'refused', value: 3 },
      top_p: { kind: 'engine', value: 0.5 },
      truncation: { kind: 'echoed', value: 'auto' },
      user: { kind: 'echoed', value: 'user-1' },
    };
    assert.deepEqual(Object.keys(RESPONSES).sort(), sdkFields('resources/responses/responses.d.ts', 'ResponseCreateParamsBase'));
    for (const [field, row] of Object.entries(RESPONSES)) await probe(field, row, send, base, baseAnswer, responseText, 'vllm-m');
    const full = await send({
      ...base,
      instructions: 'be brief',
      metadata: { k: 'v' },
      user: 'u',
      truncation: 'auto',
      prompt_cache_key: 'k',
      prompt_cache_retention: '24h',
      safety_identifier: 's',
      service_tier: 'flex',
      store: true,
      temperature: 0.5,
      top_p: 0.9,
      tools: responsesTools,
      tool_choice: 'auto',
      parallel_tool_calls: true,
      reasoning: { effort: 'none' },
      text: { verbosity: 'medium' },
      previous_response_id: earlier.id,
    });
    assert.deepEqual([full.metadata, full.user, full.truncation, full.instructions, full.previous_response_id], [{ k: 'v' }, 'u', 'auto', 'be brief', earlier.id]);
  });

  it('the rest of the Responses API: retrieve, input_items, input_tokens, cancel, delete', async () => {
    const c = client();
    const made = await c.responses.create({ model: 'm1', input: [{ role: 'user', content: 'tell me about the tides' }, { role: 'assistant', content: 'they rise' }, { role: 'user', content: 'and fall?' }], max_output_tokens: 4 });
    assert.equal((await c.responses.retrieve(made.id)).output_text, made.output_text);
    const items = await c.responses.inputItems.list(made.id);
    assert.deepEqual(items.data.map((i: any) => [i.type, i.role, i.content[0].text]), [['message', 'user', 'and fall?'], ['message', 'assistant', 'they rise'], ['message', 'user', 'tell me about the tides']], 'newest first, as OpenAI');
    const oldest = await c.responses.inputItems.list(made.id, { order: 'asc', limit: 1 });
    assert.deepEqual([oldest.data.map((i: any) => i.content[0].text), oldest.has_more], [['tell me about the tides'], true]);
    // Counted by the worker's own tokenizer (the mocker's: one token per word, its chat template's words too).
    const count = (body: Record<string, unknown>) => c.responses.inputTokens.count({ model: 'm1', ...body } as never);
    const plain = await count({ input: 'tell me about the tides' });
    assert.equal(plain.object, 'response.input_tokens');
    const INPUT_TOKENS: Record<string, Row> = {
      conversation: { kind: 'refused', value: 'conv_1' },
      input: { kind: 'honoured', value: 'tell me about the tides and the moon', check: (got, b) => assert.equal(got.input_tokens, b.input_tokens + 3) },
      instructions: { kind: 'honoured', value: 'be brief', check: (got, b) => assert.ok(got.input_tokens > b.input_tokens) },
      model: { kind: 'honoured', value: 'm1', check: (got) => assert.ok(got.input_tokens > 0) },
      parallel_tool_calls: { kind: 'accepted', value: false },
      personality: { kind: 'refused', value: 'friendly' },
      previous_response_id: { kind: 'honoured', value: made.id, check: (got, b) => assert.ok(got.input_tokens > b.input_tokens, 'the conversation so far counted') },
      reasoning: { kind: 'refused', value: { effort: 'high' } },
      text: { kind: 'accepted', value: { format: { type: 'json_object' } } },
      tool_choice: { kind: 'accepted', value: 'auto' },
      tools: { kind: 'refused', value: responsesTools },
      truncation: { kind: 'accepted', value: 'auto' },
    };
    assert.deepEqual(Object.keys(INPUT_TOKENS).sort(), sdkFields('resources/responses/input-tokens.d.ts', 'InputTokenCountParams'));
    for (const [field, row] of Object.entries(INPUT_TOKENS)) await probe(field, row, count, { input: 'tell me about the tides' }, plain, (a: { input_tokens: number }) => a.input_tokens);
    const running = await c.responses.create({ model: 'm1', input: 'tell me about the tides', background: true, max_output_tokens: 20_000 });
    await assert.rejects(c.responses.delete(running.id), (err: unknown) => err instanceof OpenAI.BadRequestError, 'a running response is not deleted');
    assert.equal((await c.responses.cancel(running.id)).status, 'cancelled');
    await c.responses.delete(running.id);
    await c.responses.delete(made.id);
    for (const id of [made.id, running.id]) {
      await assert.rejects(c.responses.retrieve(id), (err: unknown) => err instanceof OpenAI.NotFoundError, 'deleted');
      await assert.rejects(c.responses.inputItems.list(id), (err: unknown) => err instanceof OpenAI.NotFoundError);
      await assert.rejects(c.responses.retrieve(id, { stream: true }), (err: unknown) => err instanceof OpenAI.NotFoundError, 'its stream too');
    }
  });

  it('embeddings.create and models', async () => {
    const c = client();
    const base = { model: 'm1', input: 'tides' };
    const send = (body: Record<string, unknown>) => c.embeddings.create(body as never) as Promise<any>;
    const vector = (a: OpenAI.Embeddings.CreateEmbeddingResponse) => JSON.stringify(a.data[0]!.embedding);
    const baseAnswer = await send(base);
    const EMBEDDINGS: Record<string, Row> = {
      input: { kind: 'honoured', value: ['tides', 'moon'], check: (got) => assert.equal(got.data.length, 2) },
      model: { kind: 'honoured', value: 'm1', check: (got) => assert.equal(got.model, 'm1') },
      dimensions: { kind: 'honoured', value: 8, check: (got) => assert.equal(got.data[0].embedding.length, 8) },
      encoding_format: { kind: 'honoured', value: 'base64', check: (got) => assert.equal(typeof got.data[0].embedding, 'string') },
      user: { kind: 'accepted', value: 'user-1' },
    };
    assert.deepEqual(Object.keys(EMBEDDINGS).sort(), sdkFields('resources/embeddings.d.ts', 'EmbeddingCreateParams'));
    for (const [field, row] of Object.entries(EMBEDDINGS)) await probe(field, row, send, base, baseAnswer, vector);
    const models = [];
    for await (const m of c.models.list()) models.push(m.id);
    assert.deepEqual(models.sort(), ['m1', 'vllm-m']);
    assert.equal((await c.models.retrieve('m1')).id, 'm1');
  });

  it('error shapes: each SDK error class, and {message, type, param, code} always there', async () => {
    const c = client();
    /** The error's body as the SDK read it: exactly OpenAI's four fields (and retryable where a retry may succeed). */
    const shaped = (err: unknown, cls: new (...a: never[]) => unknown, code: string, param: string | null) => {
      assert.ok(err instanceof cls, `${String(err)} is a ${cls.name}`);
      const e = err as InstanceType<typeof OpenAI.APIError>;
      assert.deepEqual([e.code, e.param], [code, param]);
      const body = e.error as Record<string, unknown>;
      assert.deepEqual(Object.keys(body).filter((k) => k !== 'retryable').sort(), ['code', 'message', 'param', 'type']);
      assert.equal(typeof body.message, 'string');
      return true;
    };
    const messages = [{ role: 'user' as const, content: 'x' }];
    await assert.rejects(c.chat.completions.create({ model: 'm1', messages, temperature: 3 }), (e) => shaped(e, OpenAI.BadRequestError, 'decimal_above_max_value', 'temperature'));
    await assert.rejects(c.chat.completions.create({ model: 'm1', messages, n: 129 }), (e) => shaped(e, OpenAI.BadRequestError, 'integer_above_max_value', 'n'));
    await assert.rejects(c.chat.completions.create({ model: 'm1', messages, logprobs: true, top_logprobs: 30 }), (e) => shaped(e, OpenAI.BadRequestError, 'integer_above_max_value', 'top_logprobs'));
    await assert.rejects(c.chat.completions.create({ model: 'm1', messages, reasoning_effort: 'high' }), (e) => shaped(e, OpenAI.BadRequestError, 'unsupported_parameter', 'reasoning_effort'));
    await assert.rejects(c.chat.completions.create({ model: 'nobody', messages }), (e) => shaped(e, OpenAI.NotFoundError, 'model_not_found', null));
    await assert.rejects(client('sk-wrong').models.list(), (e) => shaped(e, OpenAI.AuthenticationError, 'invalid_api_key', null));
    await assert.rejects(c.chat.completions.retrieve('chatcmpl-nothing'), (e) => shaped(e, OpenAI.NotFoundError, 'response_not_found', null));
    // Unknown paths are 404 (a path under a route that is not one of its ids too); a known path's wrong method is 405.
    for (const path of ['/responses/compact', '/responses/input_tokens/x', '/chat/completions/not-an-id', '/nothing/here'])
      await assert.rejects(c.post(path, { body: {} }), (e) => shaped(e, OpenAI.NotFoundError, 'not_found', null), path);
    await assert.rejects(c.delete('/chat/completions'), (e) => shaped(e, OpenAI.APIError, 'method_not_allowed', null));
    // n up to 128, bounded by --max-lanes-per-request (128): one sequence each.
    assert.equal((await c.chat.completions.create({ model: 'm1', messages, n: 128, max_tokens: 1 })).choices.length, 128);
  });
});
