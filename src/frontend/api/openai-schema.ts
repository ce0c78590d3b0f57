/** Request schemas for the OpenAI-compatible routes, validated by fastify's ajv before any routing. */
import { ToolCallSchema, ToolChoiceSchema, ToolSpecSchema } from '../../protocol/tools.js';
import type { ToolCall, ToolChoice, ToolSpec } from '../../protocol/tools.js';
import { LOGIT_BIAS_SCHEMA, SAMPLING_BOUNDS } from '../../protocol/sampling.js';

/** Choices per request (n, OpenAI's bound) and prompts per completions batch: each is a sequence on a worker (--max-lanes-per-request bounds their product). */
export const MAX_CHOICES = 128;
export const MAX_BATCH = 64;

const stop = { anyOf: [{ type: 'string' }, { type: 'array', items: { type: 'string' }, maxItems: 4 }, { type: 'null' }] };

const responseFormat = {
  anyOf: [
    { type: 'null' },
    {
      type: 'object',
      required: ['type'],
      properties: {
        type: { type: 'string', enum: ['text', 'json_object', 'json_schema'] },
        json_schema: {
          type: 'object',
          required: ['name'],
          properties: {
            name: { type: 'string', minLength: 1, maxLength: 64, pattern: '^[A-Za-z0-9_-]+$' },
            description: { type: 'string' },
            schema: { type: 'object' },
            strict: { type: ['boolean', 'null'] },
          },
        },
      },
      // json_schema needs its schema object; the other types take none.
      if: { properties: { type: { const: 'json_schema' } } },
      then: { required: ['type', 'json_schema'] },
    },
  ],
} as const;

/** Penalties, logit_bias and vLLM's extras (protocol/sampling.ts), each nullable as OpenAI's fields are. */
const sampling = {
  frequency_penalty: { ...SAMPLING_BOUNDS.frequency_penalty, type: ['number', 'null'] },
  presence_penalty: { ...SAMPLING_BOUNDS.presence_penalty, type: ['number', 'null'] },
  repetition_penalty: { ...SAMPLING_BOUNDS.repetition_penalty, type: ['number', 'null'] },
  top_k: { ...SAMPLING_BOUNDS.top_k, type: ['integer', 'null'] },
  min_p: { ...SAMPLING_BOUNDS.min_p, type: ['number', 'null'] },
  logit_bias: { anyOf: [LOGIT_BIAS_SCHEMA, { type: 'null' }] },
} as const;

/** OpenAI's metadata: up to 16 string pairs, keys up to 64 characters, values up to 512 (stored with a response or a chat completion, filtered on in lists). */
export const metadataSchema = { type: ['object', 'null'], maxProperties: 16, propertyNames: { maxLength: 64 }, additionalProperties: { type: 'string', maxLength: 512 } } as const;

/** OpenAI's tiers, and those newer SDKs send (scale, fast): each mapped to one of ebb's (service-tier.ts). */
export const serviceTierSchema = { type: ['string', 'null'], enum: ['auto', 'default', 'flex', 'priority', 'scale', 'fast', null] } as const;

const common = {
  ...sampling,
  model: { type: 'string', minLength: 1 },
  max_tokens: { type: ['integer', 'null'], minimum: 1, maximum: 1_000_000 },
  temperature: { type: ['number', 'null'], minimum: 0, maximum: 2 },
  top_p: { type: ['number', 'null'], minimum: 0, maximum: 1 },
  n: { type: ['integer', 'null'], minimum: 1, maximum: MAX_CHOICES },
  seed: { type: ['integer', 'null'] },
  stop,
  stream: { type: ['boolean', 'null'] },
  stream_options: { type: ['object', 'null'], properties: { include_usage: { type: 'boolean' } } },
  user: { type: 'string' },
  response_format: responseFormat,
  service_tier: serviceTierSchema,
} as const;

/** A legacy function (`functions`): a tool's function, before tools. */
const legacyFunction = ToolSpecSchema.properties.function;

const contentPart = { type: 'object', required: ['type'], properties: { type: { type: 'string' }, text: { type: 'string' } } };

export const chatCompletionSchema = {
  type: 'object',
  required: ['model', 'messages'],
  properties: {
    ...common,
    max_completion_tokens: { type: ['integer', 'null'], minimum: 1, maximum: 1_000_000 },
    logprobs: { type: ['boolean', 'null'] },
    top_logprobs: { type: ['integer', 'null'], minimum: 0, maximum: 20 },
    messages: {
      type: 'array',
      minItems: 1,
      items: {
        type: 'object',
        required: ['role'],
        properties: {
          role: { type: 'string', enum: ['system', 'developer', 'user', 'assistant', 'tool', 'function'] },
          content: { anyOf: [{ type: 'string' }, { type: 'array', items: contentPart }, { type: 'null' }] },
          name: { type: 'string' },
          tool_calls: { anyOf: [{ type: 'array', items: ToolCallSchema, maxItems: 128 }, { type: 'null' }] },
          tool_call_id: { type: 'string', maxLength: 200 },
          // The legacy shape of an assistant's call (answered by a `function` message naming it).
          function_call: { anyOf: [{ type: 'object', required: ['name', 'arguments'], properties: { name: { type: 'string' }, arguments: { type: 'string' } } }, { type: 'null' }] },
        },
      },
    },
    tools: { anyOf: [{ type: 'array', items: ToolSpecSchema, maxItems: 128 }, { type: 'null' }] },
    tool_choice: { anyOf: [ToolChoiceSchema, { type: 'null' }] },
    parallel_tool_calls: { type: ['boolean', 'null'] },
    functions: { anyOf: [{ type: 'array', items: legacyFunction, maxItems: 128 }, { type: 'null' }] },
    function_call: { anyOf: [{ type: 'string', enum: ['none', 'auto'] }, { type: 'object', required: ['name'], properties: { name: { type: 'string', minLength: 1 } } }, { type: 'null' }] },
    store: { type: ['boolean', 'null'] },
    metadata: metadataSchema,
  },
} as const;

export const completionSchema = {
  type: 'object',
  required: ['model', 'prompt'],
  properties: {
    ...common,
    // The legacy shape: how many alternatives per token (0: the chosen token's logprob alone).
    logprobs: { type: ['integer', 'null'], minimum: 0, maximum: 20 },
    // Token-id prompts (arrays of integers) are refused by the field policy with a clear 400.
    prompt: { anyOf: [{ type: 'string' }, { type: 'array', minItems: 1, maxItems: MAX_BATCH }] },
  },
} as const;

const responsesContentPart = { type: 'object', required: ['type'], properties: { type: { type: 'string' }, text: { type: 'string' } } };

export const responsesSchema = {
  type: 'object',
  required: ['model', 'input'],
  properties: {
    model: { type: 'string', minLength: 1 },
    input: {
      anyOf: [
        { type: 'string' },
        {
          type: 'array',
          minItems: 1,
          items: {
            type: 'object',
            properties: {
              type: { type: 'string' },
              role: { type: 'string', enum: ['system', 'developer', 'user', 'assistant'] },
              content: { anyOf: [{ type: 'string' }, { type: 'array', items: responsesContentPart }] },
              call_id: { type: 'string', maxLength: 200 },
              name: { type: 'string', maxLength: 64 },
              arguments: { type: 'string' },
              output: { anyOf: [{ type: 'string' }, { type: 'array', items: responsesContentPart }] },
            },
          },
        },
      ],
    },
    instructions: { type: ['string', 'null'] },
    // Function tools are checked by the field policy (other tool types are a 400 naming tools).
    tools: { anyOf: [{ type: 'array', maxItems: 128, items: { type: 'object', required: ['type'], properties: { type: { type: 'string' }, name: { type: 'string', minLength: 1, maxLength: 64, pattern: '^[A-Za-z0-9_.-]+$' }, parameters: { type: ['object', 'null'] } } } }, { type: 'null' }] },
    tool_choice: { anyOf: [{ type: 'string', enum: ['none', 'auto', 'required'] }, { type: 'object', required: ['type'], properties: { type: { type: 'string' }, name: { type: 'string' } } }, { type: 'null' }] },
    parallel_tool_calls: { type: ['boolean', 'null'] },
    max_output_tokens: { type: ['integer', 'null'], minimum: 1, maximum: 1_000_000 },
    // Not OpenAI's Responses fields, but vLLM's and clients' extra body: carried as on chat.
    ...sampling,
    service_tier: serviceTierSchema,
    metadata: metadataSchema,
    store: { type: ['boolean', 'null'] },
    background: { type: ['boolean', 'null'] },
    previous_response_id: { type: ['string', 'null'] },
    truncation: { type: ['string', 'null'], enum: ['auto', 'disabled', null] },
    temperature: { type: ['number', 'null'], minimum: 0, maximum: 2 },
    top_p: { type: ['number', 'null'], minimum: 0, maximum: 1 },
    stream: { type: ['boolean', 'null'] },
    text: {
      type: ['object', 'null'],
      properties: {
        format: {
          type: 'object',
          required: ['type'],
          properties: {
            type: { type: 'string', enum: ['text', 'json_object', 'json_schema'] },
            name: { type: 'string', minLength: 1, maxLength: 64, pattern: '^[A-Za-z0-9_-]+$' },
            schema: { type: 'object' },
            strict: { type: ['boolean', 'null'] },
            description: { type: 'string' },
          },
          if: { properties: { type: { const: 'json_schema' } } },
          then: { required: ['type', 'name', 'schema'] },
        },
        verbosity: { type: ['string', 'null'], enum: ['low', 'medium', 'high', null] },
      },
    },
  },
} as const;

export interface ChatMessageIn {
  role: string;
  content?: string | Array<{ type: string; text?: string }> | null;
  name?: string;
  tool_calls?: ToolCall[] | null;
  tool_call_id?: string;
  /** Legacy: an assistant's call before tool_calls. */
  function_call?: { name: string; arguments: string } | null;
}

/** A legacy function (`functions`, before tools). */
export type LegacyFunction = ToolSpec['function'];

export interface OpenAIRequest {
  model: string;
  messages?: ChatMessageIn[];
  prompt?: string | unknown[];
  n?: number | null;
  max_tokens?: number | null;
  service_tier?: string | null;
  max_completion_tokens?: number | null;
  temperature?: number | null;
  top_p?: number | null;
  seed?: number | null;
  response_format?: { type: 'text' | 'json_object' | 'json_schema'; json_schema?: { name: string; description?: string; schema?: Record<string, unknown>; strict?: boolean | null } } | null;
  stop?: string | string[] | null;
  stream?: boolean | null;
  stream_options?: { include_usage?: boolean } | null;
  tools?: ToolSpec[] | null;
  /** Chat: a boolean (with top_logprobs); completions: the number of alternatives. */
  logprobs?: boolean | number | null;
  top_logprobs?: number | null;
  tool_choice?: ToolChoice | null;
  parallel_tool_calls?: boolean | null;
  frequency_penalty?: number | null;
  presence_penalty?: number | null;
  repetition_penalty?: number | null;
  logit_bias?: Record<string, number> | null;
  top_k?: number | null;
  min_p?: number | null;
  functions?: LegacyFunction[] | null;
  function_call?: 'none' | 'auto' | { name: string } | null;
  store?: boolean | null;
  metadata?: Record<string, string> | null;
}
