/**
 * The request plane: the internal protocol between frontend and worker (docs/request-plane.md).
 *
 * POST /generate with a JSON GenerateBody. With `stream` (the default) the answer is NDJSON, one
 * object per line: `{"text":"..."}` per token, then exactly one terminal line, either
 * `{"done":true,"finish_reason":...,"usage":{...}}` or `{"error":{"code":...,"message":...}}`.
 * A worker that is not admitting answers 503 `worker_draining` (or `worker_overloaded`) before
 * doing any work, so the caller can retry elsewhere.
 */

export interface ChatMessage {
  role: string;
  content: string;
}

export interface GenerateBody {
  model: string;
  prompt?: string;
  messages?: ChatMessage[];
  max_tokens?: number;
  temperature?: number;
  seed?: number;
  stop?: string | string[];
  stream?: boolean;
  request_id?: string;
  /** Decode workers: pull this prompt's KV from the prefill worker that computed it. */
  kv_transfer?: KvTransferRef;
}

/**
 * Disaggregated serving: POST /prefill on a prefill worker (same body as /generate) answers a
 * KvTransferRef once the KV is computed. The decode worker pulls it with GET {source_url}/kv/{id}
 * and confirms receipt with DELETE {source_url}/kv/{id}; until then the transfer is pending.
 */
export interface KvTransferRef {
  transfer_id: string;
  source_url: string;
}

export interface PrefillResponse extends KvTransferRef {
  prompt_tokens: number;
  kv_bytes: number;
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

export type StreamLine =
  | { text: string }
  | { done: true; finish_reason: string; usage: Usage }
  | { error: { code: string; message: string } };

export const DEFAULT_MAX_TOKENS = 16;

export const generateBodySchema = {
  type: 'object',
  required: ['model'],
  properties: {
    model: { type: 'string', minLength: 1 },
    prompt: { type: 'string' },
    messages: {
      type: 'array',
      items: { type: 'object', required: ['role', 'content'], properties: { role: { type: 'string' }, content: { type: 'string' } } },
    },
    max_tokens: { type: 'integer', minimum: 1, maximum: 1_000_000 },
    temperature: { type: 'number', minimum: 0, maximum: 2 },
    seed: { type: 'integer' },
    stop: { anyOf: [{ type: 'string' }, { type: 'array', items: { type: 'string' }, maxItems: 4 }] },
    stream: { type: 'boolean' },
    request_id: { type: 'string', maxLength: 200 },
    kv_transfer: {
      type: 'object',
      required: ['transfer_id', 'source_url'],
      properties: { transfer_id: { type: 'string', maxLength: 100 }, source_url: { type: 'string', maxLength: 500 } },
    },
  },
} as const;

/** Chat messages become one prompt; the mocker only needs its length and content for the seed. */
export function promptOf(body: GenerateBody): string | undefined {
  if (body.prompt !== undefined) return body.prompt;
  if (body.messages !== undefined) return body.messages.map((m) => `${m.role}: ${m.content}`).join('\n');
  return undefined;
}
