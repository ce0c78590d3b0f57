import type { ChatMessage, GenerateBody, ResponseFormat, TokenLogprob, Usage } from '../../protocol/request-plane.js';
import { promptShape } from './prompt-shape.js';
import { ERROR_CODES, isErrorCode } from '../../protocol/errors.js';
import { samplingOf } from '../../protocol/sampling.js';
import type { ToolChoice, ToolSpec } from '../../protocol/tools.js';
import type { ChatMessageIn, OpenAIRequest } from './openai-schema.js';
import type { SpliceFrame } from '../wire/token-splice.js';
import type { CollectedChoice, EventIds, StreamFormat } from '../wire/stream-format.js';

export type Endpoint = 'chat' | 'completion';

function messageText(content: ChatMessageIn['content']): string {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) return content.map((p) => p.text ?? '').join('');
  return '';
}

/** OpenAI's response_format as the request plane carries it: only the fields it knows (an extra one is a 400 from the worker). */
export function responseFormatOf(format: OpenAIRequest['response_format']): ResponseFormat | undefined {
  if (format == null || format.type === 'text') return undefined;
  const js = format.json_schema;
  if (format.type !== 'json_schema' || js === undefined) return { type: 'json_object' };
  return {
    type: 'json_schema',
    json_schema: {
      name: js.name,
      ...(js.description !== undefined && { description: js.description }),
      ...(js.schema !== undefined && { schema: js.schema }),
      ...(js.strict != null && { strict: js.strict }),
    },
  };
}

/**
 * The worker requests for an OpenAI request: one per choice (`n`) of each prompt (completions take
 * a batch), in OpenAI's choice order (prompt-major). Each is its own sequence on its own worker;
 * with a seed, choice i gets seed + i so the choices differ as samples do. The frontend always
 * streams from the worker, so it can retry and migrate.
 */
export function toGenerateBodies(endpoint: Endpoint, req: OpenAIRequest, requestId: string): GenerateBody[] {
  const base: GenerateBody = { model: req.model, stream: true, request_id: requestId };
  const max = req.max_completion_tokens ?? req.max_tokens;
  if (max != null) base.max_tokens = max;
  if (req.temperature != null) base.temperature = req.temperature;
  if (req.top_p != null) base.top_p = req.top_p;
  if (req.stop != null) base.stop = req.stop;
  // Only what changes the answer: a request at the defaults needs no `sampling` engine.
  const sampling = samplingOf(req as unknown as Record<string, unknown>);
  if (sampling !== undefined) Object.assign(base, sampling);
  const format = responseFormatOf(req.response_format);
  if (format !== undefined) base.response_format = format;
  const top = logprobsAsked(req);
  if (top !== undefined) {
    base.logprobs = true;
    base.top_logprobs = top;
  }
  const n = req.n ?? 1;
  const prompts: Array<Pick<GenerateBody, 'prompt' | 'messages' | 'prompt_token_ids'>> =
    endpoint === 'chat' ? [{ messages: chatMessages(req.messages ?? []) }] : completionPrompts(req.prompt);
  if (req.tools != null && req.tools.length > 0) {
    base.tools = req.tools;
    if (req.tool_choice != null) base.tool_choice = req.tool_choice;
    if (req.parallel_tool_calls != null) base.parallel_tool_calls = req.parallel_tool_calls;
  } else if (usesFunctions(req)) {
    // Legacy functions are tools; their answer carries one call (function_call), so one is asked for.
    base.tools = req.functions!.map((f): ToolSpec => ({ type: 'function', function: f }));
    const choice = legacyChoice(req.function_call);
    if (choice !== undefined) base.tool_choice = choice;
    base.parallel_tool_calls = false;
  }
  if (prompts.length === 1 && n === 1) return [{ ...base, ...prompts[0], ...(req.seed != null && { seed: req.seed }) }];
  const out: GenerateBody[] = [];
  for (const prompt of prompts)
    for (let i = 0; i < n; i++)
      out.push({ ...base, ...prompt, request_id: `${requestId}-${out.length}`, ...(req.seed != null && { seed: req.seed + i }) });
  return out;
}

/** How many alternatives per token the request asks for; undefined: no logprobs (chat's boolean, completions' count). */
export function logprobsAsked(req: OpenAIRequest): number | undefined {
  if (req.logprobs === true) return req.top_logprobs ?? 0;
  return typeof req.logprobs === 'number' ? req.logprobs : undefined;
}

/** A request that calls tools the legacy way (functions, without tools): its answer is the legacy one too. */
export function usesFunctions(req: Pick<OpenAIRequest, 'functions' | 'tools'>): boolean {
  return (req.tools == null || req.tools.length === 0) && req.functions != null && req.functions.length > 0;
}

/** function_call as tool_choice. */
function legacyChoice(call: OpenAIRequest['function_call']): ToolChoice | undefined {
  if (call == null) return undefined;
  return typeof call === 'string' ? call : { type: 'function', function: { name: call.name } };
}

/**
 * Chat messages as the request plane carries them: text content, and an assistant's calls or a
 * tool's answer. The legacy forms are mapped: an assistant's function_call is a tool call (its id
 * made from its place), and a `function` message answers the last such call.
 */
function chatMessages(messages: ChatMessageIn[]): ChatMessage[] {
  let legacyCall: string | undefined;
  return messages.map((m, i) => {
    const out: ChatMessage = { role: m.role, content: messageText(m.content) };
    if (m.tool_calls != null && m.tool_calls.length > 0) out.tool_calls = m.tool_calls;
    if (m.tool_call_id !== undefined) out.tool_call_id = m.tool_call_id;
    if (m.function_call != null && out.tool_calls === undefined) {
      legacyCall = `call_fn${i}`;
      out.tool_calls = [{ id: legacyCall, type: 'function', function: { name: m.function_call.name, arguments: m.function_call.arguments } }];
    }
    if (m.role === 'function') {
      out.role = 'tool';
      out.tool_call_id = legacyCall ?? `call_fn_${m.name ?? ''}`;
      if (m.name !== undefined) out.name = m.name;
    }
    return out;
  });
}

/** A completions prompt as request-plane prompts: one per batch entry (the field policy checked the shape). */
function completionPrompts(prompt: OpenAIRequest['prompt']): Array<Pick<GenerateBody, 'prompt' | 'prompt_token_ids'>> {
  switch (promptShape(prompt ?? '')) {
    case 'text':
      return [{ prompt: prompt as string }];
    case 'texts':
      return (prompt as string[]).map((p) => ({ prompt: p }));
    case 'ids':
      return [{ prompt_token_ids: prompt as number[] }];
    case 'id_batch':
      return (prompt as number[][]).map((ids) => ({ prompt_token_ids: ids }));
  }
}


/** A token chunk's choice around its text's JSON string, per endpoint. */
const TOKEN_OPEN: Record<Endpoint, string> = { chat: '"delta":{"content":', completion: '"text":' };
const TOKEN_CLOSE: Record<Endpoint, string> = { chat: '},"logprobs":null,"finish_reason":null}]}\n\n', completion: ',"logprobs":null,"finish_reason":null}]}\n\n' };
/** A splice frame's tail has nothing per request: one Buffer per endpoint, shared (only ever read). */
const SPLICE_TAIL: Record<Endpoint, Buffer> = { chat: Buffer.from(`"${TOKEN_CLOSE.chat}`), completion: Buffer.from(`"${TOKEN_CLOSE.completion}`) };

/**
 * Chat and completion SSE chunks. The per-token event is the hot path: everything but the token
 * text is serialised once per choice, up front.
 */
export class SseFormatter implements StreamFormat {
  private readonly heads: string[];
  private readonly object: string;
  /** `"service_tier":"…",` for chat chunks that carry one; else empty. */
  private readonly tierField: string;
  /** Completions' logprobs.text_offset: each choice's text so far, in characters. */
  private readonly offsets: number[];
  readonly created: number;

  constructor(
    readonly endpoint: Endpoint,
    readonly id: string,
    readonly model: string,
    lanes: number,
    private readonly includeUsage: boolean,
    /** The request asked for logprobs: every token event carries its own, so none is spliced. */
    private readonly logprobs = false,
    /** A kept (resumable) stream: each event carries `id: <n>`. */
    readonly ids?: EventIds,
    /** A takeover keeps the creation time the other frontend's chunks carry. */
    created = Math.floor(Date.now() / 1000),
    /** Chat chunks say the tier the request was admitted in, as OpenAI's do (in the head: no per-token cost). */
    readonly serviceTier?: string,
  ) {
    this.created = created;
    this.offsets = new Array<number>(lanes).fill(0);
    this.object = endpoint === 'chat' ? 'chat.completion.chunk' : 'text_completion';
    this.tierField = endpoint === 'chat' && serviceTier !== undefined ? `"service_tier":${JSON.stringify(serviceTier)},` : '';
    const prefix = `data: {"id":${JSON.stringify(id)},"object":"${this.object}","created":${this.created},"model":${JSON.stringify(model)},${this.tierField}"choices":[{"index":`;
    this.heads = Array.from({ length: lanes }, (_, i) => `${prefix}${i},`);
  }

  /** Chat streams open with the assistant role for each choice, as OpenAI's do. */
  /** An event's start: its id line (resumable streams) and the choice's serialised head. */
  private head(lane: number): string {
    return this.ids === undefined ? this.heads[lane]! : `${this.ids.line()}${this.heads[lane]}`;
  }

  private idLine(): string {
    return this.ids === undefined ? '' : this.ids.line();
  }

  opening(): string {
    if (this.endpoint !== 'chat') return '';
    return this.heads.map((_, lane) => `${this.head(lane)}"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n`).join('');
  }

  /** A chunk with its own delta (a tool call's pieces): `delta` is its JSON. */
  delta(lane: number, delta: string, logprobs?: TokenLogprob[]): string {
    return `${this.head(lane)}"delta":${delta},"logprobs":${logprobs === undefined ? 'null' : `{"content":${JSON.stringify(logprobs)}}`},"finish_reason":null}]}\n\n`;
  }

  /** Resumable streams number each spliced event too: the writer puts `ids`' line before the head. */
  splice(lane: number): SpliceFrame | undefined {
    if (this.logprobs) return undefined;
    return { head: Buffer.from(`${this.heads[lane]}${TOKEN_OPEN[this.endpoint]}"`), tail: SPLICE_TAIL[this.endpoint] };
  }

  token(lane: number, text: string, logprobs?: TokenLogprob[]): string {
    if (!this.logprobs) return `${this.head(lane)}${TOKEN_OPEN[this.endpoint]}${JSON.stringify(text)}${TOKEN_CLOSE[this.endpoint]}`;
    if (this.endpoint === 'chat') return this.delta(lane, `{"content":${JSON.stringify(text)}}`, logprobs);
    const offset = this.offsets[lane]!;
    this.offsets[lane] = offset + text.length;
    const lp = logprobs === undefined ? 'null' : JSON.stringify(completionLogprobs(logprobs, offset));
    return `${this.head(lane)}"text":${JSON.stringify(text)},"logprobs":${lp},"finish_reason":null}]}\n\n`;
  }

  finished(lane: number, reason: string): string {
    const choice = this.endpoint === 'chat' ? `"delta":{},"logprobs":null,"finish_reason":"${reason}"` : `"text":"","logprobs":null,"finish_reason":"${reason}"`;
    return `${this.head(lane)}${choice}}]}\n\n`;
  }

  end(usage: Usage): string {
    const tail = this.includeUsage ? `${this.idLine()}data: ${JSON.stringify({ id: this.id, object: this.object, created: this.created, model: this.model, ...(this.tierField === '' ? {} : { service_tier: this.serviceTier }), choices: [], usage })}\n\n` : '';
    return `${tail}${this.idLine()}data: [DONE]\n\n`;
  }

  error(code: string, message: string): string {
    const type = isErrorCode(code) ? ERROR_CODES[code].type : 'server_error';
    return `${this.idLine()}data: ${JSON.stringify({ error: { message, type, param: null, code } })}\n\n`;
  }

  continueFrom(next: number): void {
    this.ids?.restart(next);
  }
}


export function completionResponse(endpoint: Endpoint, id: string, model: string, choices: CollectedChoice[], usage: Usage, serviceTier?: string, legacy = false) {
  const created = Math.floor(Date.now() / 1000);
  if (endpoint === 'chat') {
    return {
      id,
      object: 'chat.completion',
      created,
      model,
      ...(serviceTier === undefined ? {} : { service_tier: serviceTier }),
      choices: choices.map((c, index) => {
        const message = legacy ? legacyAnswer(c) : chatAnswer(c);
        const finish = legacy && 'function_call' in message ? 'function_call' : c.finishReason;
        return { index, message, logprobs: c.logprobs === undefined ? null : { content: c.logprobs, refusal: null }, finish_reason: finish };
      }),
      usage,
    };
  }
  return { id, object: 'text_completion', created, model, choices: choices.map((c, index) => ({ index, text: c.text, logprobs: c.logprobs === undefined ? null : completionLogprobs(c.logprobs, 0), finish_reason: c.finishReason })), usage };
}

/** A chat choice's message: its text, or its parsed tool calls (content null when only calls). */
function chatAnswer(c: CollectedChoice) {
  if (c.tools === undefined || c.tools.calls.length === 0) return { role: 'assistant', content: c.tools?.content ?? c.text, refusal: null };
  return { role: 'assistant', content: c.tools.content, refusal: null, tool_calls: c.tools.calls };
}

/** The legacy answer to functions: its call as function_call (one: the request asked for no parallel calls). */
function legacyAnswer(c: CollectedChoice) {
  const call = c.tools?.calls[0];
  if (call === undefined) return chatAnswer(c);
  return { role: 'assistant', content: c.tools!.content, refusal: null, function_call: { name: call.function.name, arguments: call.function.arguments } };
}

/**
 * The legacy completions' logprobs shape: parallel arrays, alternatives as token -> logprob maps,
 * each token's character offset in the choice's text (from `offset`, where this piece starts).
 */
export function completionLogprobs(logprobs: TokenLogprob[], offset: number) {
  const textOffset: number[] = [];
  let at = offset;
  for (const l of logprobs) {
    textOffset.push(at);
    at += l.token.length;
  }
  return {
    tokens: logprobs.map((l) => l.token),
    token_logprobs: logprobs.map((l) => l.logprob),
    top_logprobs: logprobs.map((l) => Object.fromEntries(l.top_logprobs.map((t) => [t.token, t.logprob]))),
    text_offset: textOffset,
  };
}
