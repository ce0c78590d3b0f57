import Type, { type Static } from 'typebox';
import type { ErrorCode } from './errors.js';

/**
 * The request plane: the internal protocol between frontend and worker (docs/request-plane.md).
 * Schemas are the one source: the TypeScript types below are derived from them.
 *
 * POST /generate with a JSON GenerateBody. With `stream` (the default) the answer is NDJSON, one
 * object per line: `{"text":"..."}` per token, then exactly one terminal line, either
 * `{"done":true,"finish_reason":...,"usage":{...}}` or `{"error":{"code":...,"message":...}}`.
 * A worker that is not admitting answers 503 `worker_draining` (or `worker_overloaded`) before
 * doing any work, so the caller can retry elsewhere.
 */

export const ChatMessageSchema = Type.Object({ role: Type.String(), content: Type.String() });
export type ChatMessage = Static<typeof ChatMessageSchema>;

/**
 * Disaggregated serving: POST /prefill on a prefill worker (same body as /generate) answers a
 * PrefillResponse once the KV is computed. The decode worker pulls it with GET {source_url}/kv/{id}
 * and confirms receipt with DELETE {source_url}/kv/{id}; until then the transfer is pending. A decode
 * worker only pulls from `source_url` when it is the registered request URL of prefill worker
 * `worker_id` in its own discovery view: a request body cannot make a worker fetch arbitrary URLs.
 */
export const KvTransferRefSchema = Type.Object(
  {
    transfer_id: Type.String({ minLength: 1, maxLength: 100, pattern: '^[A-Za-z0-9._-]+$' }),
    source_url: Type.String({ minLength: 1, maxLength: 500 }),
    worker_id: Type.String({ minLength: 1, maxLength: 200 }),
  },
  { additionalProperties: false },
);
export type KvTransferRef = Static<typeof KvTransferRefSchema>;

export const GenerateBodySchema = Type.Object(
  {
    model: Type.String({ minLength: 1 }),
    prompt: Type.Optional(Type.String()),
    messages: Type.Optional(Type.Array(ChatMessageSchema)),
    max_tokens: Type.Optional(Type.Integer({ minimum: 1, maximum: 1_000_000 })),
    temperature: Type.Optional(Type.Number({ minimum: 0, maximum: 2 })),
    seed: Type.Optional(Type.Integer()),
    stop: Type.Optional(Type.Union([Type.String(), Type.Array(Type.String(), { maxItems: 4 })])),
    stream: Type.Optional(Type.Boolean()),
    /** Echoed as the x-request-id header, so it must be a legal header value. */
    request_id: Type.Optional(Type.String({ minLength: 1, maxLength: 200, pattern: '^[\\x21-\\x7e]+$' })),
    /** Decode workers only: pull this prompt's KV from the prefill worker that computed it. */
    kv_transfer: Type.Optional(KvTransferRefSchema),
  },
  { additionalProperties: false },
);
export type GenerateBody = Static<typeof GenerateBodySchema>;

export const PrefillResponseSchema = Type.Object({
  transfer_id: Type.String(),
  source_url: Type.String(),
  worker_id: Type.String(),
  prompt_tokens: Type.Integer(),
  kv_bytes: Type.Integer(),
});
export type PrefillResponse = Static<typeof PrefillResponseSchema>;

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

export type StreamLine =
  | { text: string }
  | { done: true; finish_reason: string; usage: Usage }
  | { error: { code: ErrorCode; message: string } };

export const DEFAULT_MAX_TOKENS = 16;

/** Chat messages become one prompt; the mocker only needs its length and content for the seed. */
export function promptOf(body: GenerateBody): string | undefined {
  if (body.prompt !== undefined) return body.prompt;
  if (body.messages !== undefined) return body.messages.map((m) => `${m.role}: ${m.content}`).join('\n');
  return undefined;
}
