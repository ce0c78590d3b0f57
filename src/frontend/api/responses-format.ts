import { randomUUID } from 'node:crypto';
import { EbbError } from '../../protocol/errors.js';
import { samplingOf } from '../../protocol/sampling.js';
import type { ChatMessage, GenerateBody, ResponseFormat, Usage } from '../../protocol/request-plane.js';
import type { CollectedChoice, StreamFormat } from '../wire/stream-format.js';
import type { ToolChoice, ToolSpec } from '../../protocol/tools.js';

/** The subset of OpenAI's Responses API request that ebb serves (see openai-schema.ts and field-policy.ts). */
export interface ResponsesRequest {
  model: string;
  input: string | ResponsesInputItem[];
  instructions?: string | null;
  max_output_tokens?: number | null;
  service_tier?: string | null;
  temperature?: number | null;
  top_p?: number | null;
  stream?: boolean | null;
  text?: { format?: { type: 'text' | 'json_object' | 'json_schema'; name?: string; schema?: Record<string, unknown>; strict?: boolean | null; description?: string }; verbosity?: string | null } | null;
  metadata?: Record<string, string> | null;
  user?: string | null;
  truncation?: 'auto' | 'disabled' | null;
  [field: string]: unknown;
}

/** An object field's values that were given (null and absent ones left to the defaults). */
const given = (v: unknown): Record<string, unknown> => (typeof v === 'object' && v !== null ? Object.fromEntries(Object.entries(v).filter(([, x]) => x != null)) : {});

export interface ResponsesInputItem {
  type?: string;
  role?: string;
  content?: string | Array<{ type: string; text?: string }>;
  /** function_call and function_call_output items. */
  call_id?: string;
  name?: string;
  arguments?: string;
  output?: string | Array<{ type: string; text?: string }>;
}

/** A Responses function tool (flat, unlike chat's `{type, function: {...}}`). */
interface ResponsesTool {
  type: string;
  name?: string;
  description?: string;
  parameters?: Record<string, unknown>;
  strict?: boolean | null;
}

/** Message content the engines can read: text parts only, named in the 400 otherwise. */
function itemText(item: ResponsesInputItem, i: number): string {
  if (typeof item.content === 'string') return item.content;
  if (!Array.isArray(item.content)) throw new EbbError('invalid_request', `input[${i}].content is required`, { param: `input[${i}].content` });
  return item.content
    .map((part, j) => {
      if ((part.type === 'input_text' || part.type === 'output_text') && typeof part.text === 'string') return part.text;
      throw new EbbError('unsupported_parameter', `input[${i}].content[${j}] of type "${part.type}" is not supported: ebb's engines take text`, { param: `input[${i}].content` });
    })
    .join('');
}

function formatOf(format: NonNullable<ResponsesRequest['text']>['format']): ResponseFormat | undefined {
  if (format === undefined || format.type === 'text') return undefined;
  if (format.type === 'json_object') return { type: 'json_object' };
  return {
    type: 'json_schema',
    json_schema: {
      name: format.name ?? 'response',
      ...(format.description !== undefined && { description: format.description }),
      ...(format.schema !== undefined && { schema: format.schema }),
      ...(format.strict != null && { strict: format.strict }),
    },
  };
}

/** A function call item of the input, appended to the assistant turn it belongs to (consecutive calls are one turn). */
function addCall(messages: ChatMessage[], item: ResponsesInputItem, i: number): void {
  if (typeof item.call_id !== 'string' || typeof item.name !== 'string' || typeof item.arguments !== 'string')
    throw new EbbError('invalid_request', `input[${i}] (function_call) needs call_id, name and arguments`, { param: `input[${i}]` });
  const call = { id: item.call_id, type: 'function' as const, function: { name: item.name, arguments: item.arguments } };
  const last = messages[messages.length - 1];
  if (last?.role === 'assistant' && last.tool_calls !== undefined) last.tool_calls.push(call);
  else messages.push({ role: 'assistant', content: '', tool_calls: [call] });
}

/** A function call's result, as the tool message answering it. */
function callOutput(item: ResponsesInputItem, i: number): ChatMessage {
  if (typeof item.call_id !== 'string') throw new EbbError('invalid_request', `input[${i}] (function_call_output) needs call_id`, { param: `input[${i}]` });
  const output = typeof item.output === 'string' ? item.output : itemText({ content: item.output ?? '' }, i);
  return { role: 'tool', content: output, tool_call_id: item.call_id };
}

/**
 * The worker request for a Responses request: instructions first, then the conversation so far
 * (`previous`: what previous_response_id names), then the input as chat messages. `history` is the
 * conversation without the instructions (they do not carry over to the next turn).
 */
export function responsesToGenerate(req: ResponsesRequest, requestId: string, previous: ChatMessage[] = [], instructionsAlone = false): { gen: GenerateBody; history: ChatMessage[] } {
  const messages: ChatMessage[] = [...previous];
  if (typeof req.input === 'string') messages.push({ role: 'user', content: req.input });
  else
    req.input.forEach((item, i) => {
      if (item.type === 'function_call') return addCall(messages, item, i);
      if (item.type === 'function_call_output') return void messages.push(callOutput(item, i));
      if (item.type !== undefined && item.type !== 'message')
        throw new EbbError('unsupported_parameter', `input[${i}] of type "${item.type}" is not supported: ebb serves message and function call input`, { param: `input[${i}]` });
      messages.push({ role: item.role ?? 'user', content: itemText(item, i) });
    });
  // (Counting input tokens may count instructions alone.)
  if (messages.length === previous.length && !(instructionsAlone && req.instructions != null && req.instructions !== '')) throw new EbbError('invalid_request', 'input is empty', { param: 'input' });
  const history = messages.slice();
  if (req.instructions != null && req.instructions !== '') messages.unshift({ role: 'system', content: req.instructions });
  const body: GenerateBody = { model: req.model, messages, stream: true, request_id: requestId };
  const tools = responsesTools(req.tools);
  if (tools.length > 0) {
    body.tools = tools;
    const choice = responsesToolChoice(req.tool_choice);
    if (choice !== undefined) body.tool_choice = choice;
    if (typeof req.parallel_tool_calls === 'boolean') body.parallel_tool_calls = req.parallel_tool_calls;
  }
  if (req.max_output_tokens != null) body.max_tokens = req.max_output_tokens;
  if (req.temperature != null) body.temperature = req.temperature;
  if (req.top_p != null) body.top_p = req.top_p;
  const sampling = samplingOf(req);
  if (sampling !== undefined) Object.assign(body, sampling);
  const format = formatOf(req.text?.format);
  if (format !== undefined) body.response_format = format;
  return { gen: body, history };
}

/** One input item as GET /v1/responses/{id}/input_items lists it (OpenAI's shapes: a message, a function call, its output). */
export type InputItem = Record<string, unknown> & { id: string; type: string };

/**
 * A request's input as its response's input items, oldest first: each with the id it was sent
 * with, else one made from the response's id and its place (the same at every frontend).
 */
export function inputItems(req: Pick<ResponsesRequest, 'input'>, responseId: string): InputItem[] {
  const uuid = responseId.slice('resp_'.length);
  const items = typeof req.input === 'string' ? [{ role: 'user', content: req.input } as ResponsesInputItem & { id?: string }] : ((req.input ?? []) as Array<ResponsesInputItem & { id?: string }>);
  return items.map((item, i) => {
    const id = (kind: string) => (typeof item.id === 'string' ? item.id : `${kind}_${uuid}_${i}`);
    if (item.type === 'function_call') return { id: id('fc'), type: 'function_call', call_id: item.call_id, name: item.name, arguments: item.arguments, status: 'completed' };
    if (item.type === 'function_call_output') return { id: id('fco'), type: 'function_call_output', call_id: item.call_id, output: item.output, status: 'completed' };
    const role = item.role ?? 'user';
    const partType = role === 'assistant' ? 'output_text' : 'input_text';
    const content = typeof item.content === 'string' ? [{ type: partType, text: item.content }] : (item.content ?? []);
    return { id: id('msg'), type: 'message', role, status: 'completed', content };
  });
}

/** Responses function tools as the request plane's (chat's shape); other tool types are refused by the field policy. */
export function responsesTools(tools: unknown): ToolSpec[] {
  if (!Array.isArray(tools)) return [];
  return (tools as ResponsesTool[]).map((t) => ({
    type: 'function',
    function: {
      name: t.name ?? '',
      ...(t.description !== undefined && { description: t.description }),
      ...(t.parameters != null && { parameters: t.parameters }),
      ...(t.strict != null && { strict: t.strict }),
    },
  }));
}

/** `{type: "function", name}` as chat's `{type: "function", function: {name}}`. */
export function responsesToolChoice(choice: unknown): ToolChoice | undefined {
  if (choice === 'none' || choice === 'auto' || choice === 'required') return choice;
  const name = (choice as { type?: unknown; name?: unknown } | null)?.name;
  return typeof name === 'string' ? { type: 'function', function: { name } } : undefined;
}

/** The capability a Responses request's text.format needs, for the field policy. */
export function responsesFormatNeed(text: unknown): 'json_object' | 'json_schema' | undefined {
  const type = (text as { format?: { type?: unknown } } | null)?.format?.type;
  return type === 'json_object' || type === 'json_schema' ? type : undefined;
}

const usageOf = (u: Usage) => ({
  input_tokens: u.prompt_tokens,
  input_tokens_details: { cached_tokens: u.prompt_tokens_details?.cached_tokens ?? 0 },
  output_tokens: u.completion_tokens,
  output_tokens_details: { reasoning_tokens: 0 },
  total_tokens: u.total_tokens,
});

/** A Responses object's status (OpenAI's): queued and in_progress while it runs, then how it ended. */
export type ResponseStatus = 'queued' | 'in_progress' | 'completed' | 'incomplete' | 'cancelled' | 'failed';

/** A streamed response's progress: the response object as it stands (output so far, or final). */
export interface ResponseProgress {
  now(): ReturnType<ResponseShell['object']>;
  /**
   * The response's first events: `response.created`, and for a background response (queued until
   * a worker takes it) status `queued` and `response.queued`. A background response writes them at
   * once; otherwise (or when they were not written) they open the stream's opening.
   */
  announce(): string;
}

/** The first events of a response (see ResponseProgress.announce), numbered by `event`. */
function announcement(shell: ResponseShell, event: (type: string, body: Record<string, unknown>) => string): string {
  if (shell.req.background !== true) return event('response.created', { response: shell.object('in_progress', undefined, undefined) });
  const response = shell.object('queued', undefined, undefined);
  return event('response.created', { response }) + event('response.queued', { response });
}

/** A response's announcement once: what a stream's opening starts with when it was not written before. */
export class Announcer {
  private done = false;

  constructor(private readonly shell: ResponseShell) {}

  announce(event: (type: string, body: Record<string, unknown>) => string): string {
    if (this.done) return '';
    this.done = true;
    return announcement(this.shell, event);
  }
}

/** One response's identity and echo of its request, shared by the streamed events and the final object. */
export class ResponseShell {
  readonly id: string;
  readonly messageId: string;
  createdAt: number = Math.floor(Date.now() / 1000);
  /** The tier the request was admitted in (the object's service_tier). */
  serviceTier: string = 'default';

  constructor(
    uuid: string,
    readonly req: ResponsesRequest,
    /** A takeover rebuilds the shell the other frontend made: its message id and creation time. */
    made?: { messageId: string; createdAt: number },
  ) {
    this.id = `resp_${uuid}`;
    this.messageId = made?.messageId ?? `msg_${randomUUID().replaceAll('-', '')}`;
    if (made !== undefined) this.createdAt = made.createdAt;
  }

  message(text: string, status: 'in_progress' | 'completed' | 'incomplete') {
    return { id: this.messageId, type: 'message', status, role: 'assistant', content: status === 'in_progress' && text === '' ? [] : [part(text)] };
  }

  /**
   * The response object: `in_progress` while streaming, `completed` or `incomplete` (max_output_tokens
   * reached) at the end. Its output: one message of `text`, or the items given (tool calls).
   */
  object(status: ResponseStatus, text: string | undefined, usage: Usage | undefined, items?: unknown[]) {
    return {
      id: this.id,
      object: 'response',
      created_at: this.createdAt,
      status,
      error: null,
      incomplete_details: status === 'incomplete' ? { reason: 'max_output_tokens' } : null,
      background: this.req.background === true,
      instructions: this.req.instructions ?? null,
      max_output_tokens: this.req.max_output_tokens ?? null,
      model: this.req.model,
      service_tier: this.serviceTier,
      output: items ?? (text === undefined ? [] : [this.message(text, status === 'incomplete' ? 'incomplete' : 'completed')]),
      parallel_tool_calls: this.req.parallel_tool_calls ?? true,
      previous_response_id: typeof this.req.previous_response_id === 'string' ? this.req.previous_response_id : null,
      reasoning: { effort: null, summary: null, ...given(this.req.reasoning) },
      store: this.req.store !== false,
      temperature: this.req.temperature ?? 1,
      text: { format: this.req.text?.format ?? { type: 'text' }, verbosity: this.req.text?.verbosity ?? 'medium' },
      tool_choice: this.req.tool_choice ?? 'auto',
      tools: this.req.tools ?? [],
      top_p: this.req.top_p ?? 1,
      truncation: this.req.truncation ?? 'disabled',
      usage: usage === undefined ? null : usageOf(usage),
      user: this.req.user ?? null,
      metadata: this.req.metadata ?? {},
      // Echoed as given: none changes the text (field-policy.ts).
      max_tool_calls: this.req.max_tool_calls ?? null,
      top_logprobs: this.req.top_logprobs ?? 0,
      prompt_cache_key: this.req.prompt_cache_key ?? null,
      prompt_cache_retention: this.req.prompt_cache_retention ?? null,
      safety_identifier: this.req.safety_identifier ?? null,
      conversation: null,
      prompt: null,
    };
  }
}

export const part = (text: string) => ({ type: 'output_text', text, annotations: [], logprobs: [] });

/** One Responses SSE event; in a kept (resumable) stream it carries `id: <sequence_number>`, what `starting_after` counts. */
export function responsesEvent(type: string, seq: number, body: Record<string, unknown>, kept: boolean): string {
  return `${kept ? `id: ${seq}\n` : ''}event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: seq, ...body })}\n\n`;
}

/**
 * A Responses stream's error event body: OpenAI's fields (code, message, param), and the same as an
 * `error` object, which is what makes SDKs raise (the openai SDK's stream reader throws on a data
 * object with `error`; without it a plain `for await` over the events ends short, as if complete).
 */
export function errorEventBody(code: string, message: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { code, message, param: null, ...extra, error: { type: 'server_error', code, message, param: null } };
}

/** A finish reason of the request plane as a Responses status. */
export const statusOf = (finishReason: string): 'completed' | 'incomplete' => (finishReason === 'length' ? 'incomplete' : 'completed');

/** The non-streaming Responses object. */
export function responseObject(shell: ResponseShell, choice: CollectedChoice, usage: Usage) {
  return shell.object(statusOf(choice.finishReason), choice.text, usage);
}

/**
 * The Responses API's streamed events for one message output: created, in_progress, the item and
 * its text part opened, one `response.output_text.delta` per token, the text, part and item done,
 * then `response.completed` (or `response.incomplete` when max_output_tokens cut it) with usage.
 */
export class ResponsesStream implements StreamFormat, ResponseProgress {
  private seq = 0;
  private text = '';
  private finish = 'stop';
  private usage: Usage | undefined;
  private readonly deltaHead: string;
  private readonly announcer: Announcer;

  constructor(
    private readonly shell: ResponseShell,
    private readonly kept = false,
  ) {
    this.deltaHead = `"item_id":${JSON.stringify(shell.messageId)},"output_index":0,"content_index":0,"logprobs":[],"delta":`;
    this.announcer = new Announcer(shell);
  }

  private event(type: string, body: Record<string, unknown>): string {
    return responsesEvent(type, this.seq++, body, this.kept);
  }

  announce(): string {
    return this.announcer.announce((type, body) => this.event(type, body));
  }

  opening(): string {
    const shell = this.shell;
    return (
      this.announce() +
      this.event('response.in_progress', { response: shell.object('in_progress', undefined, undefined) }) +
      this.event('response.output_item.added', { output_index: 0, item: shell.message('', 'in_progress') }) +
      this.event('response.content_part.added', { item_id: shell.messageId, output_index: 0, content_index: 0, part: part('') })
    );
  }

  /** The hot path: one event, its head serialised once. */
  token(_lane: number, text: string): string {
    this.text += text;
    const seq = this.seq++;
    return `${this.kept ? `id: ${seq}\n` : ''}event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":${seq},${this.deltaHead}${JSON.stringify(text)}}\n\n`;
  }

  finished(_lane: number, reason: string): string {
    this.finish = reason;
    const ids = { item_id: this.shell.messageId, output_index: 0, content_index: 0 };
    return (
      this.event('response.output_text.done', { ...ids, text: this.text, logprobs: [] }) +
      this.event('response.content_part.done', { ...ids, part: part(this.text) }) +
      this.event('response.output_item.done', { output_index: 0, item: this.shell.message(this.text, statusOf(reason)) })
    );
  }

  end(usage: Usage): string {
    this.usage = usage;
    return this.event(`response.${statusOf(this.finish)}`, { response: this.now() });
  }

  error(code: string, message: string): string {
    return this.event('error', errorEventBody(code, message));
  }

  continueFrom(next: number): void {
    this.seq = next;
  }

  now() {
    if (this.usage !== undefined) return this.shell.object(statusOf(this.finish), this.text, this.usage);
    return this.shell.object('in_progress', undefined, undefined, this.text === '' ? [] : [this.shell.message(this.text, 'in_progress')]);
  }
}
