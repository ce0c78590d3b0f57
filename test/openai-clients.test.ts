import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, streamText } from 'ai';
import { ChatOpenAI } from '@langchain/openai';
import { z } from 'zod';
import { zodResponseFormat } from 'openai/helpers/zod';
import { Agent, run, setDefaultOpenAIClient, setTracingDisabled, tool as agentTool } from '@openai/agents';
import { Ajv } from 'ajv';
import { call } from './helpers/http.js';
import { frontendSeesWorkers, metricValue, spawnEbb, type EbbProcess } from './helpers/processes.js';

/** `ebb up` as a new user runs it: a frontend and two mocker workers, found through its own discovery. */
let up: EbbProcess;
let base: string;
before(async () => {
  up = spawnEbb(['up', '--port', '0', '--workers', '2', '--model', 'm1', '--mocker-itl-ms', '0', '--mocker-ttft-ms', '0', '--cors-origin', 'http://app.example'], 'ebb up');
  base = (await up.waitForEvent('frontend_ready')).url as string;
  await frontendSeesWorkers(up, 2);
});
after(async () => {
  await up.terminate();
});

const client = () => new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused' });

describe('clients: the official openai SDK', () => {
  it('Responses API: plain and streamed, the same text, usage, and the event sequence', async () => {
    const c = client();
    const plain = await c.responses.create({ model: 'm1', input: 'tell me about tides', instructions: 'be brief', max_output_tokens: 6 });
    assert.equal(plain.object, 'response');
    assert.equal(plain.status, 'incomplete', 'max_output_tokens reached');
    assert.equal(plain.incomplete_details?.reason, 'max_output_tokens');
    assert.ok(plain.output_text.length > 0);
    assert.equal(plain.usage?.output_tokens, 6);
    const types: string[] = [];
    let text = '';
    for await (const event of await c.responses.create({ model: 'm1', input: 'tell me about tides', instructions: 'be brief', max_output_tokens: 6, stream: true })) {
      types.push(event.type);
      if (event.type === 'response.output_text.delta') text += event.delta;
      if (event.type === 'response.incomplete') assert.equal(event.response.usage?.output_tokens, 6);
    }
    assert.equal(text, plain.output_text, 'same request, same text, streamed or not');
    assert.deepEqual(types.slice(0, 4), ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added']);
    assert.equal(types.filter((t) => t === 'response.output_text.delta').length, 6);
    assert.deepEqual(types.slice(-4), ['response.output_text.done', 'response.content_part.done', 'response.output_item.done', 'response.incomplete']);
    // Stored (OpenAI's default): retrievable by id.
    assert.equal((await c.responses.retrieve(plain.id)).output_text, plain.output_text);
    const messages = await c.responses.create({ model: 'm1', input: [{ role: 'user', content: [{ type: 'input_text', text: 'hi' }] }], max_output_tokens: 2, store: false });
    assert.equal(messages.usage?.output_tokens, 2);
  });

  it('service_tier: each answer says the tier it was admitted in (default when none), whole and in every streamed chunk', async () => {
    const c = client();
    const messages = [{ role: 'user' as const, content: 'hi' }];
    assert.equal((await c.chat.completions.create({ model: 'm1', messages, max_tokens: 2 })).service_tier, 'default');
    assert.equal((await c.chat.completions.create({ model: 'm1', messages, max_tokens: 2, service_tier: 'auto' })).service_tier, 'default');
    assert.equal((await c.chat.completions.create({ model: 'm1', messages, max_tokens: 2, service_tier: 'priority' })).service_tier, 'priority');
    const tiers: Array<string | null | undefined> = [];
    for await (const chunk of await c.chat.completions.create({ model: 'm1', messages, max_tokens: 3, service_tier: 'flex', stream: true, stream_options: { include_usage: true } })) tiers.push(chunk.service_tier);
    assert.ok(tiers.length >= 5, `role, 3 tokens, finish, usage: ${tiers.length} chunks`);
    assert.deepEqual(new Set(tiers), new Set(['flex']), 'every chunk, the usage chunk too');
    // A gateway's header is the tier it was admitted in, over the body's.
    const gated = await c.chat.completions.create({ model: 'm1', messages, max_tokens: 2, service_tier: 'flex' }, { headers: { 'x-ebb-service-tier': 'priority' } });
    assert.equal(gated.service_tier, 'priority');
    assert.equal((await c.responses.create({ model: 'm1', input: 'hi', max_output_tokens: 2, service_tier: 'flex' })).service_tier, 'flex');
    let streamed: string | null | undefined;
    for await (const event of await c.responses.create({ model: 'm1', input: 'hi', max_output_tokens: 2, stream: true })) if (event.type === 'response.incomplete') streamed = event.response.service_tier;
    assert.equal(streamed, 'default');
  });

  it('models.retrieve', async () => {
    const c = client();
    assert.equal((await c.models.retrieve('m1')).id, 'm1');
    await assert.rejects(c.models.retrieve('nope'), (err: unknown) => err instanceof OpenAI.NotFoundError);
  });

  it('n: 2 gives two choices, streamed interleaved by index; batched prompts give a choice per prompt and n', async () => {
    const c = client();
    const chat = await c.chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'hi' }], n: 2, max_tokens: 4, seed: 1 });
    assert.deepEqual(chat.choices.map((x) => x.index), [0, 1]);
    assert.notEqual(chat.choices[0]?.message.content, chat.choices[1]?.message.content, 'each choice its own sample');
    assert.equal(chat.usage?.completion_tokens, 8);
    const texts = ['', ''];
    const finished = new Set<number>();
    for await (const chunk of await c.chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'hi' }], n: 2, max_tokens: 4, seed: 1, stream: true })) {
      for (const choice of chunk.choices) {
        texts[choice.index] += choice.delta.content ?? '';
        if (choice.finish_reason) finished.add(choice.index);
      }
    }
    assert.deepEqual(texts, chat.choices.map((x) => x.message.content));
    assert.deepEqual([...finished].sort(), [0, 1]);
    const batch = await c.completions.create({ model: 'm1', prompt: ['once upon', 'a time'], n: 2, max_tokens: 3 });
    assert.deepEqual(batch.choices.map((x) => x.index), [0, 1, 2, 3]);
    assert.equal(batch.usage?.completion_tokens, 12);
    const single = await c.completions.create({ model: 'm1', prompt: 'a time', max_tokens: 3 });
    assert.equal(batch.choices[2]?.text, single.choices[0]?.text, 'prompt-major order: choice 2 is the second prompt');
    assert.equal(batch.usage?.prompt_tokens, 4, 'each prompt counted once');
    const ids = await c.completions.create({ model: 'm1', prompt: [[11, 12, 13], [14]], max_tokens: 2 });
    assert.equal(ids.choices.length, 2, 'a batch of token-id prompts');
    assert.equal(ids.usage?.prompt_tokens, 4, 'the mocker counts one token per id');
  });

  it('without max_tokens the answer ends on its own (stop) at a length of its prompt, the same each time; max_tokens still cuts it, and so does the context', async () => {
    const ask = (content: string, extra: object = {}) => client().chat.completions.create({ model: 'm1', messages: [{ role: 'user', content }], ...extra });
    const lengths = new Set<number>();
    for (const content of ['hi', 'tell me about tides', 'what is a harbor?', 'and the river?']) {
      const res = await ask(content);
      assert.equal(res.choices[0]?.finish_reason, 'stop', content);
      const n = res.usage!.completion_tokens;
      assert.ok(n >= 16 && n <= 96, `${content}: ${n} words`);
      assert.equal((await ask(content)).usage!.completion_tokens, n, 'the same each time');
      lengths.add(n);
    }
    assert.ok(lengths.size > 1, 'the length depends on the prompt');
    const cut = await ask('tell me about tides', { max_tokens: 5 });
    assert.deepEqual([cut.choices[0]?.finish_reason, cut.usage?.completion_tokens], ['length', 5]);
    // A prompt that leaves the answer no more than 3 tokens of the mocker's 1,024: cut by the context.
    const full = await ask('tide '.repeat(1019).trim());
    assert.equal(full.choices[0]?.finish_reason, 'length');
    assert.equal(full.usage!.prompt_tokens + full.usage!.completion_tokens, 1024);
  });
});

describe('clients: agents and structured output on the mocker (as `npm start` serves it)', () => {
  const weather = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'], additionalProperties: false };

  it("the openai SDK's runTools: a two-step tool loop (the call, its result, an answer that ends with stop)", async () => {
    const called: string[] = [];
    const runner = client().chat.completions.runTools({
      model: 'm1',
      messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
      tools: [{ type: 'function', function: { name: 'get_weather', description: 'The weather in a city', parameters: weather, parse: JSON.parse, function: (args: { city: string }) => (called.push(args.city), `sunny in ${args.city}`) } }],
    });
    const final = await runner.finalChatCompletion();
    assert.equal(called.length, 1, 'the tool ran once');
    assert.deepEqual(runner.messages.map((m) => m.role), ['user', 'assistant', 'tool', 'assistant']);
    assert.equal(final.choices[0]?.finish_reason, 'stop');
    assert.ok((final.choices[0]?.message.content ?? '').length > 0);
  });

  it('an OpenAI Agents SDK agent with a function tool completes in its default mode (the Responses API)', async () => {
    setTracingDisabled(true);
    setDefaultOpenAIClient(client());
    const executed: string[] = [];
    const getWeather = agentTool({ name: 'get_weather', description: 'The weather in a city', parameters: z.object({ city: z.string() }), execute: async ({ city }) => (executed.push(city), `sunny in ${city}`) });
    const agent = new Agent({ name: 'forecaster', instructions: 'Answer with the weather tool.', model: 'm1', tools: [getWeather] });
    const result = await run(agent, 'What is the weather in Paris?');
    assert.equal(executed.length, 1);
    assert.deepEqual(result.newItems.map((i) => i.type), ['tool_call_item', 'tool_call_output_item', 'message_output_item']);
    assert.equal(typeof result.finalOutput, 'string');
    assert.ok((result.finalOutput as string).length > 0);
    assert.ok(await metricValue(base, 'ebb_frontend_requests_total', 'endpoint="/v1/responses",status="200"') >= 2, 'it called the Responses API');
  });

  it('response_format json_schema: JSON that validates against the schema (objects, arrays, enums, bounds, anyOf, $ref), and the SDK parses a zod one', async () => {
    const schema = {
      type: 'object',
      properties: {
        title: { type: 'string', minLength: 3 },
        mood: { type: 'string', enum: ['calm', 'stormy'] },
        steps: { type: 'array', minItems: 2, maxItems: 4, items: { $ref: '#/$defs/step' } },
        depth: { anyOf: [{ type: 'integer', minimum: 1, maximum: 9 }, { type: 'null' }] },
      },
      required: ['title', 'mood', 'steps', 'depth'],
      additionalProperties: false,
      $defs: { step: { type: 'object', properties: { n: { type: 'integer', minimum: 0 }, done: { type: 'boolean' } }, required: ['n', 'done'], additionalProperties: false } },
    };
    const validate = new Ajv().compile(schema);
    for (const content of ['plan the voyage', 'another plan']) {
      const res = await client().chat.completions.create({ model: 'm1', messages: [{ role: 'user', content }], response_format: { type: 'json_schema', json_schema: { name: 'plan', schema, strict: true } } });
      assert.equal(res.choices[0]?.finish_reason, 'stop');
      const answer = JSON.parse(res.choices[0]?.message.content ?? '') as unknown;
      assert.ok(validate(answer), `${JSON.stringify(answer)}: ${JSON.stringify(validate.errors)}`);
    }
    const Cube = z.object({ name: z.string(), count: z.number().int(), tags: z.array(z.string()) });
    const parsed = await client().chat.completions.parse({ model: 'm1', messages: [{ role: 'user', content: 'describe a cube' }], response_format: zodResponseFormat(Cube, 'cube') });
    assert.ok(Cube.safeParse(parsed.choices[0]?.message.parsed).success, JSON.stringify(parsed.choices[0]?.message.parsed));
    const object = await client().chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'x' }], response_format: { type: 'json_object' } });
    assert.equal(typeof JSON.parse(object.choices[0]?.message.content ?? ''), 'object');
  });
});

describe('clients: Vercel AI SDK and LangChain', () => {
  it('the AI SDK default provider (Responses API): generateText and streamText', async () => {
    const openai = createOpenAI({ baseURL: `${base}/v1`, apiKey: 'unused' });
    const generated = await generateText({ model: openai('m1'), prompt: 'tell me about tides', maxOutputTokens: 5 });
    assert.ok(generated.text.length > 0);
    assert.equal(generated.usage.outputTokens, 5);
    const streamed = streamText({ model: openai('m1'), prompt: 'tell me about tides', maxOutputTokens: 5 });
    let text = '';
    for await (const piece of streamed.textStream) text += piece;
    assert.equal(text, generated.text);
    assert.equal((await streamed.usage).outputTokens, 5);
    assert.equal(await metricValue(base, 'ebb_frontend_requests_total', 'endpoint="/v1/responses",status="200"') >= 2, true, 'it called the Responses API');
  });

  it('LangChain ChatOpenAI: invoke and stream, chat completions and the Responses API', async () => {
    for (const useResponsesApi of [false, true]) {
      const model = new ChatOpenAI({ model: 'm1', apiKey: 'unused', configuration: { baseURL: `${base}/v1` }, maxTokens: 5, useResponsesApi });
      const answer = await model.invoke('tell me about tides');
      assert.equal(typeof answer.content === 'string' ? answer.content.length > 0 : answer.text.length > 0, true, `invoke (responses: ${useResponsesApi})`);
      let streamed = '';
      for await (const chunk of await model.stream('tell me about tides')) streamed += chunk.text;
      assert.equal(streamed, answer.text, `stream (responses: ${useResponsesApi})`);
    }
  });
});

describe('clients: browsers (CORS)', () => {
  it('answers the preflight for an allowed origin and marks responses; other origins get no grant', async () => {
    const preflight = await fetch(`${base}/v1/chat/completions`, {
      method: 'OPTIONS',
      headers: { origin: 'http://app.example', 'access-control-request-method': 'POST', 'access-control-request-headers': 'content-type,authorization' },
    });
    assert.equal(preflight.status, 204);
    assert.equal(preflight.headers.get('access-control-allow-origin'), 'http://app.example');
    assert.match(preflight.headers.get('access-control-allow-methods') ?? '', /POST/);
    const res = await fetch(`${base}/v1/models`, { headers: { origin: 'http://app.example' } });
    assert.equal(res.headers.get('access-control-allow-origin'), 'http://app.example');
    const other = await fetch(`${base}/v1/models`, { headers: { origin: 'http://evil.example' } });
    assert.equal(other.headers.get('access-control-allow-origin'), null);
    const wrong = await call('DELETE', `${base}/v1/models`);
    assert.equal(wrong.status, 405);
  });

  it('/v1/embeddings too: its preflight answered, its answer marked', async () => {
    const preflight = await fetch(`${base}/v1/embeddings`, { method: 'OPTIONS', headers: { origin: 'http://app.example', 'access-control-request-method': 'POST', 'access-control-request-headers': 'content-type' } });
    assert.equal(preflight.status, 204);
    assert.equal(preflight.headers.get('access-control-allow-origin'), 'http://app.example');
    const res = await fetch(`${base}/v1/embeddings`, { method: 'POST', headers: { origin: 'http://app.example', 'content-type': 'application/json' }, body: JSON.stringify({ model: 'm1', input: 'x' }) });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('access-control-allow-origin'), 'http://app.example');
    assert.equal(((await res.json()) as { data: unknown[] }).data.length, 1);
  });
});
