/** Request schemas for the OpenAI-compatible routes, validated by fastify's ajv before any routing. */

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

const common = {
  model: { type: 'string', minLength: 1 },
  max_tokens: { type: ['integer', 'null'], minimum: 1, maximum: 1_000_000 },
  temperature: { type: ['number', 'null'], minimum: 0, maximum: 2 },
  top_p: { type: ['number', 'null'], minimum: 0, maximum: 1 },
  n: { type: ['integer', 'null'], minimum: 1, maximum: 1 },
  seed: { type: ['integer', 'null'] },
  stop,
  stream: { type: ['boolean', 'null'] },
  stream_options: { type: ['object', 'null'], properties: { include_usage: { type: 'boolean' } } },
  user: { type: 'string' },
  response_format: responseFormat,
} as const;

const contentPart = { type: 'object', required: ['type'], properties: { type: { type: 'string' }, text: { type: 'string' } } };

export const chatCompletionSchema = {
  type: 'object',
  required: ['model', 'messages'],
  properties: {
    ...common,
    max_completion_tokens: { type: ['integer', 'null'], minimum: 1, maximum: 1_000_000 },
    messages: {
      type: 'array',
      minItems: 1,
      items: {
        type: 'object',
        required: ['role'],
        properties: {
          role: { type: 'string', enum: ['system', 'developer', 'user', 'assistant', 'tool'] },
          content: { anyOf: [{ type: 'string' }, { type: 'array', items: contentPart }, { type: 'null' }] },
          name: { type: 'string' },
        },
      },
    },
  },
} as const;

export const completionSchema = {
  type: 'object',
  required: ['model', 'prompt'],
  properties: {
    ...common,
    prompt: { anyOf: [{ type: 'string' }, { type: 'array', items: { type: 'string' }, minItems: 1, maxItems: 1 }] },
  },
} as const;

export interface ChatMessageIn {
  role: string;
  content?: string | Array<{ type: string; text?: string }> | null;
}

export interface OpenAIRequest {
  model: string;
  messages?: ChatMessageIn[];
  prompt?: string | string[];
  max_tokens?: number | null;
  max_completion_tokens?: number | null;
  temperature?: number | null;
  top_p?: number | null;
  seed?: number | null;
  response_format?: { type: 'text' | 'json_object' | 'json_schema'; json_schema?: { name: string; description?: string; schema?: Record<string, unknown>; strict?: boolean | null } } | null;
  stop?: string | string[] | null;
  stream?: boolean | null;
  stream_options?: { include_usage?: boolean } | null;
}
