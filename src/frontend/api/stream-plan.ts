import type { GenerateBody, TokenLogprob, Usage } from '../../protocol/request-plane.js';
import type { ToolCallSyntax } from '../../protocol/tools.js';
import type { Resumed } from '../relay/lane.js';
import { callIds } from '../wire/tool-call-parser.js';
import { EventIds, type StreamFormat } from '../wire/stream-format.js';
import type { Endpoint } from './openai-format.js';
import { SseFormatter } from './openai-format.js';
import { ResponseShell, ResponsesStream, type ResponseProgress, type ResponsesRequest } from './responses-format.js';
import { ResponsesToolStream } from './responses-tools.js';
import { ToolCallStream } from './tool-stream.js';

/**
 * Everything a streamed response's wire format is made from: the requests its workers get and what
 * its events carry besides tokens (ids, creation time, tier, a Responses object's echo of its
 * request, the tool-call syntax). A kept stream's plan is copied to the fleet's store, so another
 * frontend builds the same format and continues it byte for byte (StreamPlan -> streamFormat).
 */
export interface StreamPlan {
  endpoint: Endpoint | 'responses';
  /** The response id (chatcmpl-, cmpl-, resp_). */
  id: string;
  gens: GenerateBody[];
  /** Choices per prompt (usage counts a prompt once per n). */
  n: number;
  /** The model as the request named it (an adapter's name, say). */
  model: string;
  includeUsage: boolean;
  created: number;
  serviceTier: string;
  logprobs: boolean;
  /** With tools: the syntax the model's calls are parsed in, and the key call ids are made from; `legacy`: the request sent functions (answered as function_call). */
  tools?: { syntax: ToolCallSyntax; key: string; legacy?: boolean } | undefined;
  responses?: { uuid: string; request: ResponsesRequest; messageId: string; createdAt: number } | undefined;
  /** A chat completion to store as it ends (store: true), at whichever frontend ends it: its request's metadata and messages. */
  stored?: { metadata: Record<string, string>; messages: unknown[] } | undefined;
  /** With tracing on: the W3C traceparent of the request's span, so a frontend that takes the stream over continues its trace. */
  traceparent?: string | undefined;
}

/** The key a request's tool call ids are derived from (the same at every frontend, so a takeover names calls alike). */
export function toolKey(gen: GenerateBody): string {
  return JSON.stringify([gen.model, gen.messages, gen.tools, gen.tool_choice, gen.seed ?? null]);
}

/** The Responses shell a plan describes (the same ids and creation time at every frontend). */
export function planShell(plan: StreamPlan): ResponseShell {
  const r = plan.responses!;
  const shell = new ResponseShell(r.uuid, r.request, r);
  shell.serviceTier = plan.serviceTier;
  return shell;
}

/** A plan's wire format; `kept`: its events carry ids (a kept stream). */
export function streamFormat(plan: StreamPlan, kept: boolean, shell?: ResponseShell): StreamFormat & Partial<ResponseProgress> {
  const tools = plan.tools;
  if (plan.endpoint === 'responses') {
    const s = shell ?? planShell(plan);
    return tools === undefined ? new ResponsesStream(s, kept) : new ResponsesToolStream(s, tools.syntax, callIds(tools.key, 0), kept);
  }
  const sse = new SseFormatter(plan.endpoint, plan.id, plan.model, plan.gens.length, plan.includeUsage, plan.logprobs, kept ? new EventIds() : undefined, plan.created, plan.serviceTier);
  return tools === undefined ? sse : new ToolCallStream(sse, tools.syntax, (lane) => callIds(tools.key, lane), plan.gens.length, tools.legacy === true);
}

/**
 * A taken-over stream's format, standing where the copy left it: its opening and each sequence's
 * delivered text fed through it (the output thrown away: the copy has it), so a tool-call parser
 * holds what it held and a Responses object has what it had; its next event numbered after the copy's last.
 */
export function replayedFormat(plan: StreamPlan, resumed: readonly Resumed[], maxId: number): StreamFormat & Partial<ResponseProgress> {
  const fmt = streamFormat(plan, true);
  // A background response's copy that holds its announcement alone (its frontend went before a worker took it): its opening is still to come.
  if (fmt.announce !== undefined && maxId + 1 === countEvents(fmt.announce())) return new OpeningFirst(fmt as StreamFormat & ResponseProgress);
  fmt.opening();
  resumed.forEach((r, lane) => {
    if (r.text !== '') fmt.token(lane, r.text);
  });
  fmt.continueFrom(maxId + 1);
  return fmt;
}

const countEvents = (events: string) => events.split('\n\n').length - 1;

/** A format whose opening goes before whatever it writes first (the relay writes no opening for a stream it continues). */
class OpeningFirst implements StreamFormat, ResponseProgress {
  private pending: string;

  constructor(private readonly inner: StreamFormat & ResponseProgress) {
    this.pending = inner.opening();
  }

  private first(out: string): string {
    const all = this.pending + out;
    this.pending = '';
    return all;
  }

  opening(): string {
    return this.first('');
  }

  token(lane: number, text: string, logprobs?: TokenLogprob[]): string {
    return this.first(this.inner.token(lane, text, logprobs));
  }

  finished(lane: number, reason: string): string {
    return this.first(this.inner.finished(lane, reason));
  }

  end(usage: Usage): string {
    return this.first(this.inner.end(usage));
  }

  error(code: string, message: string): string {
    return this.first(this.inner.error(code, message));
  }

  continueFrom(next: number): void {
    this.inner.continueFrom(next);
  }

  now() {
    return this.inner.now();
  }

  announce(): string {
    return '';
  }
}
