import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import type { ChatCompletionTool, ChatCompletionMessageParam } from 'openai/resources/chat/completions';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, jsonSchema, tool } from 'ai';
import { ChatOpenAI } from '@langchain/openai';
import { call } from './helpers/http.js';
import { startEngineSim, type EngineSim } from './helpers/engine-sim.js';
import { frontendSeesWorkers, startFleet, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';

/** Tool calling through ebb as agents use it: a fleet of mocker workers (Hermes call syntax), the official SDKs. */
const started: EbbProcess[] = [];
let frontend: FrontendHandle;
let workers: WorkerHandle[];
before(async () => {
  // A pace slow enough that a worker can be killed in the middle of a call's arguments.
  ({ frontend, workers } = await startFleet(2, ['--mocker-itl-ms', '25', '--mocker-ttft-ms', '0', '--mocker-max-context', '4096']));
  started.push(...workers, frontend);
});
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

const client = () => new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'unused', maxRetries: 0 });

const weather: ChatCompletionTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer', minimum: 1, maximum: 7 }, unit: { type: 'string', enum: ['c', 'f'] } }, required: ['city', 'days', 'unit'] },
  },
};
const time: ChatCompletionTool = { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: { tz: { type: 'string', enum: ['UTC', 'CET'] } }, required: ['tz'] } } };
const ask: ChatCompletionMessageParam[] = [{ role: 'user', content: 'what is the weather in Paris, and the time?' }];

type Call = { id: string; name: string; arguments: string };
const callsOf = (m: { tool_calls?: Array<{ id: string; type: string; function?: { name: string; arguments: string } }> | null }): Call[] =>
  (m.tool_calls ?? []).map((c) => ({ id: c.id, name: c.function!.name, arguments: c.function!.arguments }));

/** A call's arguments as the schema wants them: JSON, with every required property of the right kind. */
function assertWeatherArgs(args: string): void {
  const parsed = JSON.parse(args) as { city: unknown; days: unknown; unit: unknown };
  assert.equal(typeof parsed.city, 'string');
  assert.ok(Number.isInteger(parsed.days) && (parsed.days as number) >= 1 && (parsed.days as number) <= 7, `days within 1..7: ${args}`);
  assert.ok(parsed.unit === 'c' || parsed.unit === 'f', `unit from its enum: ${args}`);
}

describe('tool calling: the openai SDK', () => {
  it('required: parallel calls, the same streamed and not, then the tool results answered in text', async () => {
    const c = client();
    const plain = await c.chat.completions.create({ model: 'm1', messages: ask, tools: [weather, time], tool_choice: 'required', temperature: 0 });
    const choice = plain.choices[0]!;
    assert.equal(choice.finish_reason, 'tool_calls');
    assert.equal(choice.message.content, null, 'only calls: content is null');
    const calls = callsOf(choice.message);
    assert.equal(calls.length, 2, 'parallel calls: two tools, two calls');
    assert.deepEqual(calls.map((x) => x.name).sort(), ['get_time', 'get_weather']);
    assertWeatherArgs(calls.find((x) => x.name === 'get_weather')!.arguments);
    assert.match(calls[0]!.id, /^call_[0-9a-f]{24}$/);
    assert.notEqual(calls[0]!.id, calls[1]!.id);

    // Streamed: the SDK assembles the delta.tool_calls pieces into the same calls, ids included.
    const stream = c.chat.completions.stream({ model: 'm1', messages: ask, tools: [weather, time], tool_choice: 'required', temperature: 0 });
    let argumentPieces = 0;
    stream.on('chunk', (chunk) => {
      for (const d of chunk.choices[0]?.delta.tool_calls ?? []) if (d.function?.arguments) argumentPieces++;
    });
    const final = await stream.finalChatCompletion();
    assert.deepEqual(callsOf(final.choices[0]!.message), calls);
    assert.equal(final.choices[0]!.finish_reason, 'tool_calls');
    assert.ok(argumentPieces > 2, `arguments stream in pieces (${argumentPieces})`);

    // The results go back as tool messages; the mocker answers a tool's result in text.
    const answer = await c.chat.completions.create({
      model: 'm1',
      messages: [...ask, choice.message, ...calls.map((x) => ({ role: 'tool' as const, tool_call_id: x.id, content: '12 degrees' }))],
      tools: [weather, time],
      max_tokens: 5,
    });
    assert.equal(answer.choices[0]!.message.tool_calls, undefined);
    assert.ok((answer.choices[0]!.message.content ?? '').length > 0);
  });

  it('tool_choice: a named function, parallel_tool_calls false, none', async () => {
    const c = client();
    const named = await c.chat.completions.create({ model: 'm1', messages: ask, tools: [weather, time], tool_choice: { type: 'function', function: { name: 'get_weather' } } });
    assert.deepEqual(callsOf(named.choices[0]!.message).map((x) => x.name), ['get_weather']);
    assertWeatherArgs(named.choices[0]!.message.tool_calls![0]!.type === 'function' ? callsOf(named.choices[0]!.message)[0]!.arguments : '');
    const single = await c.chat.completions.create({ model: 'm1', messages: ask, tools: [weather, time], tool_choice: 'required', parallel_tool_calls: false });
    assert.equal(callsOf(single.choices[0]!.message).length, 1);
    const none = await c.chat.completions.create({ model: 'm1', messages: ask, tools: [weather, time], tool_choice: 'none', max_tokens: 4 });
    assert.equal(none.choices[0]!.message.tool_calls, undefined);
    assert.equal(none.choices[0]!.finish_reason, 'length');
    await assert.rejects(
      c.chat.completions.create({ model: 'm1', messages: ask, tools: [weather], tool_choice: { type: 'function', function: { name: 'nope' } } }),
      (err: unknown) => err instanceof OpenAI.BadRequestError && /tool_choice names function "nope"/.test(err.message),
    );
    const completions = await call('POST', `${frontend.url}/v1/completions`, { model: 'm1', prompt: 'x', tools: [weather] });
    assert.equal(completions.status, 400);
    assert.match(JSON.stringify(completions.body), /tools is not supported on \/v1\/completions/);
  });

  it('a drain deadline in the middle of a call\'s arguments: handed off, the same call comes out', async () => {
    const c = client();
    const request = { model: 'm1', messages: ask, tools: [weather, time], tool_choice: 'required' as const, temperature: 0, stream: true as const };
    const reference = callsOf((await c.chat.completions.stream(request).finalChatCompletion()).choices[0]!.message);
    const mark = frontend.mark();
    const { data, response } = await c.chat.completions.create(request).withResponse();
    const servedBy = workers.find((w) => w.workerId === response.headers.get('x-ebb-worker-id'))!;
    const got: Call[] = [];
    let drain: Promise<unknown> | undefined;
    for await (const chunk of data)
      for (const d of chunk.choices[0]?.delta.tool_calls ?? []) {
        if (d.id !== undefined) got[d.index] = { id: d.id, name: d.function?.name ?? '', arguments: '' };
        got[d.index]!.arguments += d.function?.arguments ?? '';
        if (drain === undefined && got[d.index]!.arguments.length > 0) drain = call('POST', `${servedBy.systemUrl}/engine/drain`, { deadline_ms: 0, persist: false });
      }
    await drain;
    const moved = await frontend.waitForEvent('stream_migrated', () => true, { after: mark });
    assert.equal(moved.reason, 'handoff');
    assert.deepEqual(got, reference, 'ids, names and arguments byte-identical');
    // Back in rotation for the cases after this one.
    const back = frontend.mark();
    await call('POST', `${servedBy.systemUrl}/engine/resume`);
    await frontend.waitForEvent('worker_added', (l) => l.worker_id === servedBy.workerId, { after: back });
  });

  it('a worker SIGKILLed in the middle of a call\'s arguments: the call comes out the same as undisturbed', async () => {
    const c = client();
    const request = { model: 'm1', messages: ask, tools: [weather], tool_choice: 'required' as const, temperature: 0, stream: true as const };
    const undisturbed = await c.chat.completions.stream(request).finalChatCompletion();
    const reference = callsOf(undisturbed.choices[0]!.message);
    assert.equal(reference.length, 1);

    const mark = frontend.mark();
    const { data, response } = await c.chat.completions.create(request).withResponse();
    const servedBy = workers.find((w) => w.workerId === response.headers.get('x-ebb-worker-id'));
    assert.ok(servedBy, `x-ebb-worker-id names a worker: ${response.headers.get('x-ebb-worker-id')}`);
    const got: Call[] = [];
    let finish: string | null = null;
    let killed = false;
    for await (const chunk of data) {
      const ch = chunk.choices[0];
      for (const d of ch?.delta.tool_calls ?? []) {
        if (d.id !== undefined) got[d.index] = { id: d.id, name: d.function?.name ?? '', arguments: '' };
        got[d.index]!.arguments += d.function?.arguments ?? '';
        // Some of the arguments are out: the worker dies under the call.
        if (!killed && got[d.index]!.arguments.length > 0) {
          killed = true;
          servedBy.proc.kill('SIGKILL');
        }
      }
      if (ch?.finish_reason) finish = ch.finish_reason;
    }
    assert.ok(killed, 'the worker was killed mid-arguments');
    await frontend.waitForEvent('stream_migrated', () => true, { after: mark });
    assert.deepEqual(got, reference, 'ids, names and arguments byte-identical');
    assert.equal(finish, 'tool_calls');
  });
});

describe('tool calling: the Responses API', () => {
  const fnWeather = { type: 'function' as const, name: 'get_weather', description: 'The weather in a city', parameters: weather.function.parameters!, strict: false };
  const fnTime = { type: 'function' as const, name: 'get_time', parameters: time.function.parameters!, strict: false };

  it('function_call items, streamed as their events and not, then function_call_output answered in text', async () => {
    const c = client();
    const plain = await c.responses.create({ model: 'm1', input: 'weather and time?', tools: [fnWeather, fnTime], tool_choice: 'required' });
    const calls = plain.output.filter((o) => o.type === 'function_call');
    assert.equal(calls.length, 2);
    assert.equal(plain.output.length, 2, 'no message: the answer is only calls');
    assert.deepEqual(calls.map((x) => x.name).sort(), ['get_time', 'get_weather']);
    assertWeatherArgs(calls.find((x) => x.name === 'get_weather')!.arguments);
    assert.equal(plain.status, 'completed');

    const types: string[] = [];
    let deltas = '';
    let done: unknown;
    for await (const e of await c.responses.create({ model: 'm1', input: 'weather and time?', tools: [fnWeather, fnTime], tool_choice: 'required', stream: true })) {
      types.push(e.type);
      if (e.type === 'response.function_call_arguments.delta' && e.output_index === 0) deltas += e.delta;
      if (e.type === 'response.completed') done = e.response.output;
    }
    assert.deepEqual(done, plain.output, 'the same items, streamed or not (ids from the request)');
    assert.equal(deltas, calls[0]!.arguments);
    assert.deepEqual(types.slice(0, 3), ['response.created', 'response.in_progress', 'response.output_item.added']);
    assert.equal(types.filter((t) => t === 'response.function_call_arguments.done').length, 2);
    assert.equal(types.at(-1), 'response.completed');

    const answer = await c.responses.create({
      model: 'm1',
      input: [{ role: 'user', content: 'weather and time?' }, ...calls, ...calls.map((x) => ({ type: 'function_call_output' as const, call_id: x.call_id, output: '12 degrees' }))],
      tools: [fnWeather, fnTime],
      max_output_tokens: 4,
    });
    assert.equal(answer.output.filter((o) => o.type === 'function_call').length, 0);
    assert.ok(answer.output_text.length > 0, 'a tool result is answered in text');
    await assert.rejects(
      c.responses.create({ model: 'm1', input: 'x', tools: [{ type: 'web_search' }] }),
      (err: unknown) => err instanceof OpenAI.BadRequestError && /ebb carries function tools/.test(err.message),
    );
  });
});

describe('tool calling: other agent SDKs', () => {
  it('the Vercel AI SDK: generateText with a tool, executed, then answered', async () => {
    const provider = createOpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'unused' });
    const executed: unknown[] = [];
    const result = await generateText({
      model: provider.chat('m1'),
      prompt: 'what is the weather in Paris?',
      toolChoice: 'required',
      maxOutputTokens: 64,
      tools: {
        get_weather: tool({
          description: 'The weather in a city',
          inputSchema: jsonSchema<{ city: string }>({ type: 'object', properties: { city: { type: 'string' } }, required: ['city'] }),
          execute: async (input) => {
            executed.push(input);
            return { temperature: 12 };
          },
        }),
      },
    });
    assert.equal(executed.length, 1, 'the SDK ran the tool the model called');
    assert.equal(typeof (executed[0] as { city: unknown }).city, 'string');
    assert.equal(result.toolCalls.length, 1);
    assert.equal(result.toolCalls[0]!.toolName, 'get_weather');
  });

  it('LangChain: bindTools', async () => {
    const model = new ChatOpenAI({ model: 'm1', apiKey: 'unused', configuration: { baseURL: `${frontend.url}/v1` }, maxRetries: 0 });
    const bound = model.bindTools([weather], { tool_choice: 'required' });
    const message = await bound.invoke('what is the weather in Paris?');
    assert.equal(message.tool_calls?.length, 1);
    assert.equal(message.tool_calls![0]!.name, 'get_weather');
    assertWeatherArgs(JSON.stringify(message.tool_calls![0]!.args));
  });
});

/** `--engine openai` in front of simulated vLLM servers that speak Hermes tool calls (test/helpers/engine-sim.ts). */
describe('tool calling: in front of vLLM (simulated)', () => {
  let vllm: FrontendHandle;
  let vllmWorkers: WorkerHandle[];
  const sims: EngineSim[] = [];
  before(async () => {
    const discovery = tempDiscoveryUrl();
    for (let i = 0; i < 2; i++) sims.push(await startEngineSim({ kind: 'vllm', itlMs: 25 }));
    vllmWorkers = await Promise.all(
      sims.map((sim) => startWorker(['--discovery', discovery, '--model', 'v1', '--engine', 'openai', '--engine-kind', 'vllm', '--engine-url', sim.url, '--engine-tool-syntax', 'hermes'])),
    );
    started.push(...vllmWorkers);
    vllm = await startFrontend(discovery);
    started.push(vllm);
    await frontendSeesWorkers(vllm, 2);
  });
  after(async () => {
    await Promise.all(sims.map((s) => s.close()));
  });
  const vclient = () => new OpenAI({ baseURL: `${vllm.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  /** What the engines were sent with tools, since the last call (each case reads only its own). */
  const toolRequests = () => sims.flatMap((s) => s.seen.splice(0)).filter((r) => Array.isArray(r.body.tools));

  it('auto: the engine renders the tools and answers raw (tool_choice none to vLLM); ebb parses the call', async () => {
    toolRequests();
    const r = await vclient().chat.completions.create({ model: 'v1', messages: ask, tools: [weather] });
    assert.equal(r.choices[0]!.finish_reason, 'tool_calls');
    assert.deepEqual(callsOf(r.choices[0]!.message).map((x) => [x.name, JSON.parse(x.arguments)]), [['get_weather', { city: 'harbor town', days: 3, unit: 'c' }]]);
    const sent = toolRequests();
    assert.equal(sent.length, 1);
    assert.equal(sent[0]!.body.tool_choice, 'none', "vLLM's parser is not asked: the text stays raw");
    assert.equal(sent[0]!.body.tools[0].function.name, 'get_weather');
    // The round trip: the call and its result go back to the engine as history; it answers in text.
    const calls = callsOf(r.choices[0]!.message);
    const answer = await vclient().chat.completions.create({ model: 'v1', messages: [...ask, r.choices[0]!.message, { role: 'tool', tool_call_id: calls[0]!.id, content: '12 degrees' }], tools: [weather], max_tokens: 3 });
    assert.ok(answer.choices[0]!.message.content);
    const history = toolRequests().at(-1)!.body.messages as Array<{ role: string; tool_calls?: unknown[]; tool_call_id?: string }>;
    assert.equal(history[1]!.tool_calls?.length, 1, 'the assistant turn carries its call');
    assert.equal(history[2]!.tool_call_id, calls[0]!.id);
  });

  it('a forced call: vLLM answers it structured, ebb writes it as raw text and parses the same call, streamed too', async () => {
    const named = { type: 'function' as const, function: { name: 'get_weather' } };
    toolRequests();
    const plain = await vclient().chat.completions.create({ model: 'v1', messages: ask, tools: [weather, time], tool_choice: named });
    assert.deepEqual(callsOf(plain.choices[0]!.message).map((x) => [x.name, JSON.parse(x.arguments)]), [['get_weather', { city: 'harbor town', days: 3, unit: 'c' }]]);
    assert.equal(plain.choices[0]!.finish_reason, 'tool_calls');
    assert.deepEqual(toolRequests().at(-1)!.body.tool_choice, named);
    const streamed = await vclient().chat.completions.stream({ model: 'v1', messages: ask, tools: [weather, time], tool_choice: named }).finalChatCompletion();
    assert.deepEqual(callsOf(streamed.choices[0]!.message), callsOf(plain.choices[0]!.message));
  });

  it("a worker SIGKILLed in the middle of a forced call's arguments: the next engine continues the raw call, the same call comes out", async () => {
    const request = { model: 'v1', messages: ask, tools: [weather], tool_choice: 'required' as const, temperature: 0, stream: true as const };
    const reference = callsOf((await vclient().chat.completions.stream(request).finalChatCompletion()).choices[0]!.message);
    toolRequests();
    const mark = vllm.mark();
    const { data, response } = await vclient().chat.completions.create(request).withResponse();
    const servedBy = vllmWorkers.find((w) => w.workerId === response.headers.get('x-ebb-worker-id'))!;
    const got: Call[] = [];
    let killed = false;
    for await (const chunk of data)
      for (const d of chunk.choices[0]?.delta.tool_calls ?? []) {
        if (d.id !== undefined) got[d.index] = { id: d.id, name: d.function?.name ?? '', arguments: '' };
        got[d.index]!.arguments += d.function?.arguments ?? '';
        if (!killed && got[d.index]!.arguments.length > 0) {
          killed = true;
          servedBy.proc.kill('SIGKILL');
        }
      }
    await vllm.waitForEvent('stream_migrated', () => true, { after: mark });
    assert.deepEqual(got, reference);
    const continued = toolRequests().find((r) => r.body.continue_final_message === true)!.body;
    assert.equal(continued.tool_choice, 'none', 'a continuation is not forced again: the call is half written');
    assert.equal(continued.continue_final_message, true);
    assert.match(continued.messages.at(-1).content, /^<tool_call>\n\{"name": "get_weather", "arguments": /);
  });
});

describe('tool calling: a model that writes its arguments as a JSON string', () => {
  it('the call comes out with the arguments object\'s text, streamed and not, and nothing of it in content', async () => {
    const sim = await startEngineSim({ kind: 'vllm', itlMs: 1, stringArguments: true });
    const discovery = tempDiscoveryUrl();
    const worker = await startWorker(['--discovery', discovery, '--model', 's1', '--engine', 'openai', '--engine-kind', 'vllm', '--engine-url', sim.url, '--engine-tool-syntax', 'hermes']);
    const fe = await startFrontend(discovery);
    started.push(worker, fe);
    try {
      await frontendSeesWorkers(fe, 1);
      const c = new OpenAI({ baseURL: `${fe.url}/v1`, apiKey: 'unused', maxRetries: 0 });
      const expected = JSON.stringify({ city: 'harbor town', days: 3, unit: 'c' });
      const plain = await c.chat.completions.create({ model: 's1', messages: ask, tools: [weather] });
      assert.match(sim.seen.at(-1)!.path, /chat\/completions/);
      assert.equal(plain.choices[0]!.finish_reason, 'tool_calls');
      assert.equal(plain.choices[0]!.message.content, null, 'nothing of the call is content');
      assert.deepEqual(callsOf(plain.choices[0]!.message).map((x) => [x.name, x.arguments]), [['get_weather', expected]]);
      const stream = await c.chat.completions.create({ model: 's1', messages: ask, tools: [weather], stream: true });
      let content = '';
      let args = '';
      for await (const chunk of stream) {
        content += chunk.choices[0]?.delta.content ?? '';
        for (const d of chunk.choices[0]?.delta.tool_calls ?? []) args += d.function?.arguments ?? '';
      }
      assert.equal(content, '', 'streamed: nothing of the call is content');
      assert.equal(args, expected);
    } finally {
      await sim.close();
    }
  });
});
