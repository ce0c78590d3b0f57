import type { Capability } from '../../protocol/capabilities.js';
import { EbbError } from '../../protocol/errors.js';
import { isNeutral, SAMPLING_FIELDS } from '../../protocol/sampling.js';
import { boundSchemas, type SchemaParams } from '../../protocol/schema-bounds.js';
import type { ResponseFormat } from '../../protocol/request-plane.js';
import type { ToolSpec } from '../../protocol/tools.js';
import { promptShape } from './prompt-shape.js';
import { responsesFormatNeed, responsesToolChoice, responsesTools } from './responses-format.js';
import type { WorkerPool } from '../routing/worker-pool.js';

/**
 * What the frontend does with each OpenAI request field. A field that would change the answer is
 * never dropped silently: it is carried to the engine, carried only to engines that declare the
 * capability it needs, or refused with 400 `unsupported_parameter` naming it.
 *
 * - `carried`: translated into the request plane (the schema bounds its values; `check`, where
 *   set, refuses the values ebb cannot carry, e.g. token-id prompts or image parts);
 * - `capability`: carried to workers whose engine declares what the value needs; 400 when no
 *   worker of the model does;
 * - `ignored`: no effect on the generated text (bookkeeping fields);
 * - `refused`: ebb cannot honour it yet; 400 unless the value is the default, which changes nothing.
 * Fields not in the table are ignored, as OpenAI adds fields faster than servers follow.
 */
type Policy =
  | { kind: 'carried'; check?: (value: unknown, body: Record<string, unknown>) => void }
  | { kind: 'capability'; needs: (value: unknown) => Capability | undefined; check?: (value: unknown, body: Record<string, unknown>) => void }
  | { kind: 'ignored' }
  | { kind: 'refused'; isDefault: (value: unknown) => boolean; why: string };

const carried: Policy = { kind: 'carried' };
const checked = (check: (value: unknown, body: Record<string, unknown>) => void): Policy => ({ kind: 'carried', check });
const unsupported = (param: string, message: string) => new EbbError('unsupported_parameter', message, { param });

/** Chat content: text, or text parts; an image or audio part would be dropped, so it is refused. */
function textOnlyMessages(messages: unknown): void {
  (messages as Array<{ content?: unknown }>).forEach((m, i) => {
    if (!Array.isArray(m.content)) return;
    (m.content as Array<{ type?: unknown }>).forEach((p, j) => {
      if (p.type !== 'text') throw unsupported('messages', `messages[${i}].content[${j}] of type "${String(p.type)}" is not supported: ebb's engines take text`);
    });
  });
}

/** Token-id prompts go only to engines that evaluate their own tokenizer's ids. */
function promptNeeds(prompt: unknown): Capability | undefined {
  const shape = promptShape(prompt);
  return shape === 'ids' || shape === 'id_batch' ? 'prompt_token_ids' : undefined;
}

/** Tools are a chat field: a completions prompt has no turn to answer them in. Each one's parameters within the schema bounds. */
function chatTools(value: unknown, body: Record<string, unknown>): void {
  if (Array.isArray(value) && value.length > 0 && body.messages === undefined) throw unsupported('tools', 'tools is not supported on /v1/completions: use /v1/chat/completions');
  if (Array.isArray(value)) boundSchemas(undefined, value as ToolSpec[]);
}

/** A json_schema response_format within the schema bounds (what guided generation may cost: schema-bounds.ts). */
function boundedFormat(value: unknown): void {
  const f = value as { type?: unknown } | null;
  if (f?.type === 'json_schema') boundSchemas(f as ResponseFormat, undefined);
}

/** The Responses API's names for where its schemas are. */
const RESPONSES_SCHEMA_PARAMS: SchemaParams = { format: 'text.format', tool: (i) => `tools[${i}].parameters` };

/** Responses' text.format, within the schema bounds; its verbosity only at the default (ebb's engines write as they write). */
function boundedText(value: unknown): void {
  const verbosity = (value as { verbosity?: unknown } | null)?.verbosity;
  if (verbosity != null && verbosity !== 'medium') throw unsupported('text.verbosity', `text.verbosity "${String(verbosity)}" is not supported: ${NO_VERBOSITY}`);
  const format = (value as { format?: { type?: unknown; name?: unknown; schema?: unknown } } | null)?.format;
  if (format?.type === 'json_schema' && typeof format.schema === 'object' && format.schema !== null)
    boundSchemas({ type: 'json_schema', json_schema: { name: String(format.name ?? ''), schema: format.schema as Record<string, unknown> } }, undefined, RESPONSES_SCHEMA_PARAMS);
}

/** The Responses API's hosted tools (web search, file search, ...) need OpenAI's servers; ebb carries function tools, their parameters within the schema bounds. */
function functionToolsOnly(value: unknown): void {
  if (!Array.isArray(value)) return;
  (value as Array<{ type?: unknown; name?: unknown }>).forEach((t, i) => {
    if (t.type !== 'function') throw unsupported('tools', `tools[${i}] of type "${String(t.type)}" is not supported: ebb carries function tools`);
    if (typeof t.name !== 'string') throw new EbbError('invalid_request', `tools[${i}].name is required`, { param: 'tools' });
  });
  boundSchemas(undefined, responsesTools(value), RESPONSES_SCHEMA_PARAMS);
}

/** A named function must be one of tools; `required` needs tools to choose from (OpenAI answers 400 to both). */
function toolChoiceFits(value: unknown, body: Record<string, unknown>): void {
  if (value == null || value === 'none' || value === 'auto') return;
  const tools = Array.isArray(body.tools) ? (body.tools as Array<{ function?: { name?: string } }>) : [];
  if (value === 'required') {
    if (tools.length === 0) throw new EbbError('invalid_request', 'tool_choice "required" needs tools', { param: 'tool_choice' });
    return;
  }
  const name = (value as { function?: { name?: unknown } }).function?.name;
  if (!tools.some((t) => t.function?.name === name)) throw new EbbError('invalid_request', `tool_choice names function "${String(name)}", which is not in tools`, { param: 'tool_choice' });
}

/** Legacy functions are tools by another name (chat only); a request sends one or the other. Each one's parameters within the schema bounds. */
function legacyFunctions(value: unknown, body: Record<string, unknown>): void {
  if (!Array.isArray(value)) return;
  if (body.messages === undefined) throw unsupported('functions', 'functions is not supported on /v1/completions: use /v1/chat/completions');
  if (Array.isArray(body.tools) && body.tools.length > 0) throw new EbbError('invalid_request', 'send tools or functions, not both (functions is the legacy form of tools)', { param: 'functions' });
  boundSchemas(undefined, (value as ToolSpec['function'][]).map((f) => ({ type: 'function', function: f })), { format: 'response_format', tool: (i) => `functions[${i}].parameters` });
}

/** function_call (legacy tool_choice): a named function must be one of functions. */
function functionCallFits(value: unknown, body: Record<string, unknown>): void {
  if (value == null || value === 'none' || value === 'auto') return;
  const name = (value as { name?: unknown }).name;
  const functions = Array.isArray(body.functions) ? (body.functions as Array<{ name?: unknown }>) : [];
  if (!functions.some((f) => f.name === name)) throw new EbbError('invalid_request', `function_call names function "${String(name)}", which is not in functions`, { param: 'function_call' });
}

/** OpenAI answers 400 to top_logprobs without logprobs: true (chat). */
function onlyWithLogprobs(value: unknown, body: Record<string, unknown>): void {
  if (value != null && value !== 0 && body.logprobs !== true) throw new EbbError('invalid_request', 'top_logprobs needs logprobs: true', { param: 'top_logprobs' });
}

/** OpenAI and vLLM answer 400 to stream_options on a request that does not stream. */
function onlyWhenStreaming(value: unknown, body: Record<string, unknown>): void {
  if (value != null && body.stream !== true) throw new EbbError('invalid_request', 'stream_options is only allowed when stream is true', { param: 'stream_options' });
}
const ignored: Policy = { kind: 'ignored' };
const unset = (v: unknown) => v === null || v === undefined;
const refused = (isDefault: (v: unknown) => boolean, why: string): Policy => ({ kind: 'refused', isDefault: (v) => unset(v) || isDefault(v), why });
const NOT_CARRIED = 'ebb does not carry it to engines yet';
const NO_REASONING = 'ebb serves no reasoning models (only "none" asks for what they do)';
const NO_VERBOSITY = 'ebb\'s engines write as the model writes (only "medium", the default, is honoured)';
const TEXT_ONLY = 'ebb\'s engines answer in text';
const NO_MODERATION = 'ebb runs no moderation model over requests or answers';
/** Reasoning asked of a model that does none: only `none` (or nothing) is what it does. */
const noReasoning = (v: unknown) => v === 'none';

export type FieldPolicy = Readonly<Record<string, Policy>>;

/** Penalties, logit_bias, top_k, min_p: carried to engines that declare `sampling` when they change the answer (protocol/sampling.ts). */
const SAMPLING_POLICY: FieldPolicy = Object.fromEntries(SAMPLING_FIELDS.map((f) => [f, { kind: 'capability', needs: (v: unknown) => (isNeutral(f, v) ? undefined : 'sampling') } satisfies Policy]));

/** /v1/chat/completions and /v1/completions. */
export const FIELD_POLICY: FieldPolicy = {
  model: carried,
  messages: checked(textOnlyMessages),
  prompt: { kind: 'capability', needs: promptNeeds },
  max_tokens: carried,
  max_completion_tokens: carried,
  temperature: carried,
  top_p: carried,
  seed: carried,
  stop: carried,
  stream: carried,
  stream_options: checked(onlyWhenStreaming),
  n: carried, // each choice is its own sequence
  response_format: {
    kind: 'capability',
    needs: (v) => {
      const type = (v as { type?: unknown } | null)?.type;
      return type === 'json_object' || type === 'json_schema' ? type : undefined;
    },
    check: boundedFormat,
  },
  user: ignored,
  metadata: ignored, // kept with a stored completion (store: true), filtered on by its list
  store: carried, // kept in the response store (a 400 naming it where none is kept: --stream-store none)
  service_tier: carried, // the admission queue's tier (--queue-timeout); scale and fast are priority (service-tier.ts)
  parallel_tool_calls: carried,
  prediction: ignored, // predicted outputs make an answer faster where an engine uses them, never another answer
  prompt_cache_key: ignored, // ebb's routing finds cached prefixes itself
  prompt_cache_retention: ignored,
  prompt_cache_options: ignored,
  safety_identifier: ignored,
  moderation: refused(() => false, NO_MODERATION),
  reasoning_effort: refused(noReasoning, NO_REASONING),
  verbosity: refused((v) => v === 'medium', NO_VERBOSITY),
  modalities: refused((v) => Array.isArray(v) && v.every((m) => m === 'text'), TEXT_ONLY),
  audio: refused(() => false, TEXT_ONLY),
  web_search_options: refused(() => false, 'ebb searches no web: its engines answer from the prompt alone'),
  logprobs: { kind: 'capability', needs: (v) => (v === true || typeof v === 'number' ? 'logprobs' : undefined) },
  top_logprobs: checked(onlyWithLogprobs),
  tools: { kind: 'capability', needs: (v) => (Array.isArray(v) && v.length > 0 ? 'tools' : undefined), check: chatTools },
  tool_choice: checked(toolChoiceFits),
  functions: { kind: 'capability', needs: (v) => (Array.isArray(v) && v.length > 0 ? 'tools' : undefined), check: legacyFunctions }, // mapped to tools
  function_call: checked(functionCallFits), // mapped to tool_choice
  ...SAMPLING_POLICY,
  best_of: refused((v) => v === 1, 'ebb generates one sequence per request'),
  echo: refused((v) => v === false, NOT_CARRIED),
  suffix: refused(() => false, NOT_CARRIED),
};

/** /v1/responses. */
export const RESPONSES_FIELD_POLICY: FieldPolicy = {
  model: carried,
  input: carried, // item and content types are checked where the input is translated (responses-format.ts)
  instructions: carried,
  max_output_tokens: carried,
  temperature: carried,
  top_p: carried,
  ...SAMPLING_POLICY,
  stream: carried,
  text: { kind: 'capability', needs: responsesFormatNeed, check: boundedText },
  // Echoed in the response object, no effect on the text:
  user: ignored,
  metadata: ignored,
  truncation: ignored, // a conversation past the context is a 400 (context_length_exceeded) either way, never cut silently
  max_tool_calls: ignored, // OpenAI's bound on built-in tool calls: ebb has none
  prompt_cache_key: ignored,
  prompt_cache_retention: ignored,
  prompt_cache_options: ignored,
  safety_identifier: ignored,
  stream_options: ignored, // include_obfuscation: ebb pads no events
  moderation: refused(() => false, NO_MODERATION),
  context_management: refused((v) => Array.isArray(v) && v.length === 0, 'ebb compacts no conversation: one past the context is a 400 (context_length_exceeded)'),
  service_tier: carried, // the admission queue's tier (--queue-timeout); scale and fast are priority (service-tier.ts)
  parallel_tool_calls: carried,
  store: carried, // kept for --response-ttl-ms (retrieve, previous_response_id); false: forgotten once answered
  previous_response_id: carried, // a stored response of this frontend's (400 naming it otherwise)
  conversation: refused(() => false, 'ebb keeps responses, not conversations: send previous_response_id, or the conversation as input'),
  background: carried, // needs kept responses (--stream-store): 400 naming it otherwise
  tools: { kind: 'capability', needs: (v) => (Array.isArray(v) && v.length > 0 ? 'tools' : undefined), check: functionToolsOnly },
  tool_choice: checked((v, body) => toolChoiceFits(responsesToolChoice(v) ?? v, { ...body, tools: responsesTools(body.tools) })),
  include: refused((v) => Array.isArray(v) && v.length === 0, NOT_CARRIED),
  reasoning: refused((v) => typeof v === 'object' && v !== null && Object.entries(v).every(([k, x]) => unset(x) || (k === 'effort' && noReasoning(x))), NO_REASONING),
  top_logprobs: refused((v) => v === 0, NOT_CARRIED),
  prompt: refused(() => false, 'prompt templates are not supported: send input'),
};

/**
 * POST /v1/responses/input_tokens: what the count is of. Nothing is generated, so sampling, format
 * and tool choice change nothing; what would change the count and ebb cannot count is refused.
 */
export const INPUT_TOKENS_FIELD_POLICY: FieldPolicy = {
  model: carried,
  input: carried,
  instructions: carried,
  previous_response_id: carried,
  conversation: RESPONSES_FIELD_POLICY.conversation!,
  reasoning: RESPONSES_FIELD_POLICY.reasoning!,
  // A worker's tokenizer counts the conversation as its chat template renders it, tools aside: a count with tools would be short.
  tools: refused((v) => Array.isArray(v) && v.length === 0, 'ebb counts the input as the model\'s chat template renders it, without tools: count without them'),
  personality: refused(() => false, 'ebb\'s models have no style presets'),
  tool_choice: ignored,
  parallel_tool_calls: ignored,
  text: ignored,
  truncation: ignored,
};

/** /v1/embeddings: token-id inputs need an engine that takes its own tokenizer's ids; `embeddings` itself is checked per model first. */
export const EMBEDDINGS_FIELD_POLICY: FieldPolicy = {
  model: carried,
  input: { kind: 'capability', needs: promptNeeds },
  dimensions: carried, // an engine that cannot shorten its vectors answers 400 naming it
  encoding_format: carried,
  user: ignored,
};

/**
 * Checks a request's fields against the table and the fleet: resolves when every field can be
 * honoured by some worker of the model, throws 400 `unsupported_parameter` naming the first that
 * cannot. Routing then sends the request only to workers that declare what it needs.
 */
export function checkFields(body: Record<string, unknown>, table: FieldPolicy, pool: WorkerPool): void {
  for (const field in body) {
    const policy = table[field];
    if (policy === undefined || policy.kind === 'ignored') continue;
    const value = body[field];
    if (policy.kind === 'carried') {
      policy.check?.(value, body);
      continue;
    }
    if (policy.kind === 'refused') {
      if (!policy.isDefault(value)) throw unsupported(field, `${field} is not supported: ${policy.why}`);
      continue;
    }
    policy.check?.(value, body);
    // tools with tool_choice none are only rendered: no call to parse, nothing a worker must declare.
    const need = field === 'tools' && body.tool_choice === 'none' ? undefined : policy.needs(value);
    if (need === undefined) continue;
    const model = body.model as string;
    if (!pool.declares(model, need)) {
      const engines = pool.engineKinds(model).join(', ') || 'unknown';
      throw unsupported(field, `${field} ${need} is not supported by any worker of model "${model}" (engines: ${engines})`);
    }
  }
}
