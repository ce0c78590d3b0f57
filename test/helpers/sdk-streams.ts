/**
 * One streamed request through each OpenAI SDK as plain user code writes it, and what the SDK
 * assembled from it: the text of each choice, tool calls with their arguments, logprobs, how it
 * ended, and the error it raised, if it did. A stream's assembly is JSON, so two runs compare whole.
 */
import OpenAI from 'openai';
import { createOpenAI } from '@ai-sdk/openai';
import { jsonSchema, streamText, tool } from 'ai';
import { ChatOpenAI, OpenAI as LangChainOpenAI } from '@langchain/openai';

export type Sdk = 'openai' | 'ai-sdk' | 'langchain';
/** What is asked: chat text, chat with tool calls, chat with logprobs, chat with two choices, completions, the Responses API. */
export type Ask = 'chat' | 'chat-tools' | 'chat-logprobs' | 'chat-n2' | 'completions' | 'responses';

export interface SdkRun {
  /** What the SDK handed the code, assembled (JSON). */
  assembled: Record<string, unknown>;
  /** What it raised (the openai SDK and LangChain throw; the AI SDK's stream carries an error part). */
  error?: unknown;
}

/** Every ask an SDK can make (the AI SDK has no `n`). */
export const ASKS: Record<Sdk, Ask[]> = {
  openai: ['chat', 'chat-tools', 'chat-logprobs', 'chat-n2', 'completions', 'responses'],
  'ai-sdk': ['chat', 'chat-tools', 'chat-logprobs', 'completions', 'responses'],
  langchain: ['chat', 'chat-tools', 'chat-logprobs', 'chat-n2', 'completions', 'responses'],
};

const PROMPT = 'tell me about tides';
const weatherSchema = { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' }, unit: { type: 'string', enum: ['c', 'f'] } }, required: ['city', 'days', 'unit'] } as const;
const timeSchema = { type: 'object', properties: { tz: { type: 'string' } }, required: ['tz'] } as const;

/**
 * `maxRetries` (the openai SDK's; 0 unless given, so no retry hides a loss): a request that never got
 * an answer (its connection closed before one) is sent again that many times, as the SDK does by default.
 */
export function runSdk(sdk: Sdk, ask: Ask, baseURL: string, fetch?: typeof globalThis.fetch, maxRetries = 0): Promise<SdkRun> {
  if (sdk === 'openai') return viaOpenAI(ask, baseURL, fetch, maxRetries);
  if (sdk === 'ai-sdk') return viaAiSdk(ask, baseURL, fetch);
  return viaLangChain(ask, baseURL, fetch);
}

async function viaOpenAI(ask: Ask, baseURL: string, fetch?: typeof globalThis.fetch, maxRetries = 0): Promise<SdkRun> {
  const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries, ...(fetch ? { fetch } : {}) });
  const assembled: Record<string, unknown> = {};
  try {
    if (ask === 'responses') {
      const types: string[] = [];
      let text = '';
      for await (const event of await client.responses.create({ model: 'm1', input: PROMPT, stream: true })) {
        types.push(event.type);
        if (event.type === 'response.output_text.delta') text += event.delta;
        if (event.type === 'response.completed') assembled.final = event.response.output_text;
        Object.assign(assembled, { text, types });
      }
      return { assembled };
    }
    if (ask === 'completions') {
      const texts: string[] = [];
      for await (const chunk of await client.completions.create({ model: 'm1', prompt: PROMPT, stream: true })) {
        for (const choice of chunk.choices) texts[choice.index] = (texts[choice.index] ?? '') + choice.text;
        assembled.texts = texts;
      }
      return { assembled };
    }
    const stream = await client.chat.completions.create({
      model: 'm1',
      messages: [{ role: 'user', content: PROMPT }],
      stream: true,
      ...(ask === 'chat-tools' ? { tools: [{ type: 'function', function: { name: 'get_weather', parameters: weatherSchema } }, { type: 'function', function: { name: 'get_time', parameters: timeSchema } }] } : {}),
      ...(ask === 'chat-logprobs' ? { logprobs: true, top_logprobs: 1 } : {}),
      ...(ask === 'chat-n2' ? { n: 2 } : {}),
    });
    const choices: Array<{ content: string; calls: Array<{ id?: string; name?: string; arguments: string }>; logprobs: Array<[string, number]>; finish?: string }> = [];
    for await (const chunk of stream) {
      // As user code reads a chunk: its choices are there (a chunk without them is a TypeError here).
      for (const choice of chunk.choices) {
        const c = (choices[choice.index] ??= { content: '', calls: [], logprobs: [] });
        c.content += choice.delta.content ?? '';
        for (const call of choice.delta.tool_calls ?? []) {
          const into = (c.calls[call.index] ??= { arguments: '' });
          if (call.id) into.id = call.id;
          if (call.function?.name) into.name = call.function.name;
          into.arguments += call.function?.arguments ?? '';
        }
        for (const lp of choice.logprobs?.content ?? []) c.logprobs.push([lp.token, lp.logprob]);
        if (choice.finish_reason) c.finish = choice.finish_reason;
      }
      assembled.choices = choices;
    }
    return { assembled };
  } catch (error) {
    return { assembled, error };
  }
}

async function viaAiSdk(ask: Ask, baseURL: string, fetch?: typeof globalThis.fetch): Promise<SdkRun> {
  const provider = createOpenAI({ baseURL, apiKey: 'unused', ...(fetch ? { fetch } : {}) });
  const model = ask === 'responses' ? provider.responses('m1') : ask === 'completions' ? provider.completion('m1') : provider.chat('m1');
  const assembled: Record<string, unknown> = {};
  let error: unknown;
  const result = streamText({
    model,
    prompt: PROMPT,
    maxRetries: 0,
    ...(ask === 'chat-tools' ? { tools: { get_weather: tool({ inputSchema: jsonSchema(weatherSchema) }), get_time: tool({ inputSchema: jsonSchema(timeSchema) }) } } : {}),
    ...(ask === 'chat-logprobs' ? { providerOptions: { openai: { logprobs: 1 } } } : {}),
    onError: ({ error: e }) => {
      error ??= e;
    },
  });
  let text = '';
  const calls: Array<{ id: string; name: string; input: unknown }> = [];
  const deltas: Record<string, string> = {};
  try {
    for await (const part of result.fullStream) {
      if (part.type === 'text-delta') text += part.text;
      else if (part.type === 'tool-input-delta') deltas[part.id] = (deltas[part.id] ?? '') + part.delta;
      else if (part.type === 'tool-call') calls.push({ id: part.toolCallId, name: part.toolName, input: part.input });
      else if (part.type === 'finish-step' && ask === 'chat-logprobs') assembled.logprobs = part.providerMetadata?.openai?.logprobs;
      else if (part.type === 'finish') assembled.finishReason = part.finishReason;
      else if (part.type === 'error') error ??= part.error;
      Object.assign(assembled, { text, calls, deltas });
    }
  } catch (e) {
    error ??= e;
  }
  return error === undefined ? { assembled } : { assembled, error };
}

async function viaLangChain(ask: Ask, baseURL: string, fetch?: typeof globalThis.fetch): Promise<SdkRun> {
  const configuration = { baseURL, ...(fetch ? { fetch } : {}) };
  const assembled: Record<string, unknown> = {};
  try {
    if (ask === 'completions') {
      const llm = new LangChainOpenAI({ model: 'm1', apiKey: 'unused', configuration, maxRetries: 0 });
      let text = '';
      for await (const piece of await llm.stream(PROMPT)) {
        text += piece;
        assembled.text = text;
      }
      return { assembled };
    }
    const chat = new ChatOpenAI({
      model: 'm1',
      apiKey: 'unused',
      configuration,
      maxRetries: 0,
      useResponsesApi: ask === 'responses',
      ...(ask === 'chat-logprobs' ? { logprobs: true, topLogprobs: 1 } : {}),
      ...(ask === 'chat-n2' ? { n: 2 } : {}),
    });
    const runnable =
      ask === 'chat-tools'
        ? chat.bindTools([
            { type: 'function', function: { name: 'get_weather', parameters: weatherSchema } },
            { type: 'function', function: { name: 'get_time', parameters: timeSchema } },
          ])
        : chat;
    let text = '';
    const calls: Array<{ id?: string; name?: string; args: string }> = [];
    const logprobs: unknown[] = [];
    for await (const chunk of await runnable.stream(PROMPT)) {
      text += chunk.text;
      for (const c of chunk.tool_call_chunks ?? []) {
        const into = (calls[c.index ?? 0] ??= { args: '' });
        if (c.id) into.id = c.id;
        if (c.name) into.name = c.name;
        into.args += c.args ?? '';
      }
      const lp = (chunk.response_metadata as { logprobs?: { content?: unknown[] } } | undefined)?.logprobs?.content;
      if (lp) logprobs.push(...lp);
      Object.assign(assembled, { text, calls, logprobs });
    }
    return { assembled };
  } catch (error) {
    return { assembled, error };
  }
}
