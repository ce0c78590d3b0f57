import type { Static } from 'typebox';
import { Type } from './schema.js';
import type { ErrorCode } from './errors.js';
import { ToolCallSchema, ToolChoiceSchema, ToolSpecSchema } from './tools.js';
import { LOGIT_BIAS_SCHEMA, MAX_LOGIT_BIAS_ENTRIES, SAMPLING_BOUNDS } from './sampling.js';

/** A sampling field's bounds without its type (the builder sets it). */
function bounds(field: keyof typeof SAMPLING_BOUNDS): Record<string, number> {
  const { type: _type, ...rest } = SAMPLING_BOUNDS[field];
  return rest;
}

/**
 * The request plane: the internal protocol between frontend and worker (docs/request-plane.md).
 * Schemas are the one source: the TypeScript types below are derived from them.
 *
 * POST /generate with a JSON GenerateBody. With `stream` (the default) the answer is NDJSON, one
 * object per line: `{"text":"..."}` per token, then exactly one terminal line, either
 * `{"done":true,"finish_reason":...,"usage":{...}}`, `{"error":{"code":...,"message":...}}`, or, at a
 * drain deadline, `{"handoff":{...}}`: the worker stopped and the caller continues elsewhere.
 * A worker that is not admitting answers 503 `worker_draining` (or `worker_overloaded`) before
 * doing any work, so the caller can retry elsewhere.
 */

/** OpenAI's service tiers as the request plane carries them, first served first (`auto` is `default`). */
export const RequestTierSchema = Type.Union([Type.Literal('priority'), Type.Literal('default'), Type.Literal('flex')]);
export type RequestTier = Static<typeof RequestTierSchema>;

/** A chat message; an assistant turn may carry its tool calls, a `tool` turn answers one (`tool_call_id`). */
export const ChatMessageSchema = Type.Object({
  role: Type.String(),
  content: Type.String(),
  tool_calls: Type.Optional(Type.Array(ToolCallSchema, { maxItems: 128 })),
  tool_call_id: Type.Optional(Type.String({ maxLength: 200 })),
  name: Type.Optional(Type.String({ maxLength: 200 })),
});
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
    /** Prompt tokens the prefill worker found in its prefix cache: cached before the request arrived. */
    cached_tokens: Type.Optional(Type.Integer({ minimum: 0 })),
  },
  { additionalProperties: false },
);
export type KvTransferRef = Static<typeof KvTransferRefSchema>;

/**
 * Stream migration: what another worker already generated for this request. The receiving worker
 * continues from it, so the caller relays one unbroken answer; `max_tokens` is what is left.
 */
export const ContinuationSchema = Type.Object(
  {
    text: Type.String({ maxLength: 10_000_000 }),
    completion_tokens: Type.Integer({ minimum: 0, maximum: 1_000_000 }),
    token_ids: Type.Optional(Type.Array(Type.Integer({ minimum: 0 }), { maxItems: 1_000_000 })),
  },
  { additionalProperties: false },
);
export type ContinuationBody = Static<typeof ContinuationSchema>;

/** OpenAI's response_format; `json_object` and `json_schema` go only to engines that declare them. */
export const ResponseFormatSchema = Type.Union([
  Type.Object({ type: Type.Literal('text') }, { additionalProperties: false }),
  Type.Object({ type: Type.Literal('json_object') }, { additionalProperties: false }),
  Type.Object(
    {
      type: Type.Literal('json_schema'),
      json_schema: Type.Object(
        {
          name: Type.String({ minLength: 1, maxLength: 64 }),
          description: Type.Optional(Type.String()),
          schema: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
          strict: Type.Optional(Type.Union([Type.Boolean(), Type.Null()])),
        },
        { additionalProperties: false },
      ),
    },
    { additionalProperties: false },
  ),
]);
export type ResponseFormat = Static<typeof ResponseFormatSchema>;

export const GenerateBodySchema = Type.Object(
  {
    model: Type.String({ minLength: 1 }),
    prompt: Type.Optional(Type.String()),
    /** The prompt as token ids of the engine's own tokenizer; only for engines that declare prompt_token_ids. */
    prompt_token_ids: Type.Optional(Type.Array(Type.Integer({ minimum: 0 }), { minItems: 1, maxItems: 1_000_000 })),
    messages: Type.Optional(Type.Array(ChatMessageSchema)),
    /** 0 is allowed for a continuation whose budget is spent: the worker only finishes the answer. */
    max_tokens: Type.Optional(Type.Integer({ minimum: 0, maximum: 1_000_000 })),
    temperature: Type.Optional(Type.Number({ minimum: 0, maximum: 2 })),
    top_p: Type.Optional(Type.Number({ minimum: 0, maximum: 1 })),
    seed: Type.Optional(Type.Integer()),
    /** Sampling beyond these (sampling.ts): only carried when they change the answer, only to engines that declare `sampling`. */
    frequency_penalty: Type.Optional(Type.Number(bounds('frequency_penalty'))),
    presence_penalty: Type.Optional(Type.Number(bounds('presence_penalty'))),
    repetition_penalty: Type.Optional(Type.Number(bounds('repetition_penalty'))),
    logit_bias: Type.Optional(Type.Record(Type.String(), Type.Number(LOGIT_BIAS_SCHEMA.additionalProperties), { maxProperties: MAX_LOGIT_BIAS_ENTRIES, propertyNames: LOGIT_BIAS_SCHEMA.propertyNames })),
    top_k: Type.Optional(Type.Integer(bounds('top_k'))),
    min_p: Type.Optional(Type.Number(bounds('min_p'))),
    stop: Type.Optional(Type.Union([Type.String(), Type.Array(Type.String(), { maxItems: 4 })])),
    stream: Type.Optional(Type.Boolean()),
    /** Echoed as the x-request-id header, so it must be a legal header value. */
    request_id: Type.Optional(Type.String({ minLength: 1, maxLength: 200, pattern: '^[\\x21-\\x7e]+$' })),
    /** Decode workers only: pull this prompt's KV from the prefill worker that computed it. */
    kv_transfer: Type.Optional(KvTransferRefSchema),
    continuation: Type.Optional(ContinuationSchema),
    /**
     * With a continuation after a drain-deadline hand-off: the KV state (prompt + delivered tokens)
     * the worker that handed the stream off exported. Workers whose engine loads KV pull it from
     * that worker (registered in their discovery view) instead of re-evaluating; the others, or a
     * pull that fails, re-evaluate from the continuation.
     */
    handoff_kv: Type.Optional(KvTransferRefSchema),
    response_format: Type.Optional(ResponseFormatSchema),
    /** Functions the model may call: rendered into its prompt; the calls come back in its raw text (tools.ts). */
    tools: Type.Optional(Type.Array(ToolSpecSchema, { maxItems: 128 })),
    tool_choice: Type.Optional(ToolChoiceSchema),
    /** false: at most one call per answer. */
    parallel_tool_calls: Type.Optional(Type.Boolean()),
    /** Each generated token's logprob, and `top_logprobs` alternatives; only for engines that declare logprobs. */
    logprobs: Type.Optional(Type.Boolean()),
    top_logprobs: Type.Optional(Type.Integer({ minimum: 0, maximum: 20 })),
    /** A LoRA adapter over `model` (the client named it as its model): the worker loads it when it is not resident. */
    adapter: Type.Optional(Type.String({ minLength: 1, maxLength: 128, pattern: '^[A-Za-z0-9][A-Za-z0-9._:@-]*$' })),
    /**
     * The tier the frontend admitted it in (absent: default). A worker admits `flex` only while its
     * engine has a free batch slot beyond its priority reserve; its engine's queue serves by tier.
     */
    service_tier: Type.Optional(RequestTierSchema),
    /**
     * A flex stream the worker may pause for a priority request that finds no free batch slot: it
     * ends with a `preempted` hand-off line, and the frontend continues it later (here or on
     * another worker). The frontend sets it while the stream was preempted fewer than its
     * --max-preemptions times, and only for workers whose engine declares `preemption`.
     */
    preemptible: Type.Optional(Type.Boolean()),
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
  /** Prompt tokens found in the prefill worker's prefix cache (not computed for this request); absent where the engine cannot tell. */
  cached_tokens: Type.Optional(Type.Integer()),
});
export type PrefillResponse = Static<typeof PrefillResponseSchema>;

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  /**
   * As OpenAI's: prompt tokens this request did not have to compute because they were cached before
   * it arrived (in the prefix cache of the worker that ran it, or of the prefill worker whose KV a
   * decode worker loaded; a KV handed over mid-request is not "cached"). Absent where the engine cannot tell.
   */
  prompt_tokens_details?: { cached_tokens: number };
}

/**
 * POST /tokenize (same body as /generate; only model, prompt, messages, prompt_token_ids and
 * continuation are read): the token ids the worker's prefix cache hashes for that request, for the
 * frontend's cache-aware routing. Workers whose engine cannot tokenize answer 404 not_found.
 */
export interface TokenizeResponse {
  token_ids: number[];
}

/**
 * Why a worker stopped a stream it had started, for the caller to continue: its drain deadline
 * (elsewhere), or a priority request that took its batch slot (`preempted`: later, here or elsewhere).
 */
export interface Handoff {
  reason: 'drain_deadline' | 'preempted';
  /** Tokens this worker generated for the request (a continuation's earlier tokens not included). */
  completion_tokens: number;
  /** Where the next worker may pull this sequence's KV state (engines that export it), so it need not re-evaluate it. */
  kv?: KvTransferRef;
}

/** One candidate token and its natural-log probability; `bytes` its UTF-8 bytes (OpenAI's chat `logprobs.content[].top_logprobs[]`). */
export interface TopLogprob {
  token: string;
  logprob: number;
  bytes: number[] | null;
}

/** A generated token's logprob with the most likely alternatives at its position (OpenAI's chat `logprobs.content[]`). */
export interface TokenLogprob extends TopLogprob {
  top_logprobs: TopLogprob[];
}

export type StreamLine =
  | { text: string; token_ids?: number[]; logprobs?: TokenLogprob[] }
  | { done: true; finish_reason: string; usage: Usage }
  | { error: { code: ErrorCode; message: string } }
  | { handoff: Handoff };


/** Chat messages become one prompt; the mocker only needs its length and content for the seed. */
export function promptOf(body: GenerateBody): string | undefined {
  if (body.prompt !== undefined) return body.prompt;
  if (body.messages !== undefined) return body.messages.map(messageLine).join('\n');
  // Engines that declare prompt_token_ids read the ids; the text is for logs and for the mocker, which counts one token per id.
  if (body.prompt_token_ids !== undefined) return body.prompt_token_ids.join(' ');
  return undefined;
}

/** One message of a chat prompt as the mocker reads it (and as the frontend hashes it for routing): its calls included. */
function messageLine(m: ChatMessage): string {
  const calls = m.tool_calls === undefined ? '' : m.tool_calls.map((c) => ` {"name": "${c.function.name}", "arguments": ${c.function.arguments}}`).join('');
  return `${m.role}: ${m.content}${calls}`;
}

/**
 * POST /embed: one admitted request embedding `input` (texts, or token ids of the engine's own
 * tokenizer: those only to engines that declare prompt_token_ids), answered as one JSON
 * EmbedResponse once every vector is computed. Admitted, refused and drained exactly like /generate.
 */
export const MAX_EMBED_INPUTS = 2048; // OpenAI's bound on inputs per request
export const MAX_EMBED_DIMENSIONS = 65_536;
export const EmbedBodySchema = Type.Object(
  {
    model: Type.String({ minLength: 1 }),
    input: Type.Union([
      Type.Array(Type.String({ minLength: 1, maxLength: 1_000_000 }), { minItems: 1, maxItems: MAX_EMBED_INPUTS }),
      Type.Array(Type.Array(Type.Integer({ minimum: 0 }), { minItems: 1, maxItems: 100_000 }), { minItems: 1, maxItems: MAX_EMBED_INPUTS }),
    ]),
    /** Truncate each vector to this many dimensions (engines that cannot answer 400 naming `dimensions`). */
    dimensions: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_EMBED_DIMENSIONS })),
    request_id: Type.Optional(Type.String({ minLength: 1, maxLength: 200, pattern: '^[\\x21-\\x7e]+$' })),
  },
  { additionalProperties: false },
);
export type EmbedBody = Static<typeof EmbedBodySchema>;

/** Each vector as little-endian float32, base64: OpenAI's `encoding_format: "base64"`, so the frontend passes it on as is. */
export interface EmbedResponse {
  data: Array<{ index: number; embedding: string }>;
  usage: { prompt_tokens: number; total_tokens: number };
}
