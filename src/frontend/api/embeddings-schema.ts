import { MAX_EMBED_DIMENSIONS, MAX_EMBED_INPUTS } from '../../protocol/request-plane.js';

/** One input's bounds: OpenAI's limit is tokens (8192 for its models); the engine checks its own context. */
const MAX_INPUT_CHARS = 1_000_000;
const MAX_INPUT_IDS = 100_000;

const text = { type: 'string', minLength: 1, maxLength: MAX_INPUT_CHARS } as const;
const ids = { type: 'array', minItems: 1, maxItems: MAX_INPUT_IDS, items: { type: 'integer', minimum: 0 } } as const;

/** POST /v1/embeddings, as OpenAI defines it (and the openai SDK's embeddings.create sends it). */
export const embeddingsSchema = {
  type: 'object',
  required: ['model', 'input'],
  properties: {
    model: { type: 'string', minLength: 1 },
    // A string, strings, token ids, or arrays of token ids: never a mix.
    input: {
      anyOf: [text, { type: 'array', minItems: 1, maxItems: MAX_EMBED_INPUTS, items: text }, ids, { type: 'array', minItems: 1, maxItems: MAX_EMBED_INPUTS, items: ids }],
    },
    dimensions: { type: ['integer', 'null'], minimum: 1, maximum: MAX_EMBED_DIMENSIONS },
    encoding_format: { enum: ['float', 'base64', null] },
    user: { type: 'string' },
  },
} as const;

export interface EmbeddingsRequest {
  model: string;
  input: string | string[] | number[] | number[][];
  dimensions?: number | null;
  encoding_format?: 'float' | 'base64' | null;
  user?: string;
}
