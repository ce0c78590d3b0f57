import type { Usage } from '../../protocol/request-plane.js';
import type { ToolCallSyntax } from '../../protocol/tools.js';
import type { ParsedCalls } from '../wire/tool-call-parser.js';
import { ToolCallParser, type ToolEvent } from '../wire/tool-call-parser.js';
import type { CollectedChoice, StreamFormat } from '../wire/stream-format.js';
import { Announcer, errorEventBody, part, responsesEvent, statusOf, type ResponseProgress, type ResponseShell } from './responses-format.js';

/** A function call output item, as the Responses API has it. */
function callItem(call: { id: string; name: string; arguments: string }, status: 'in_progress' | 'completed') {
  return { type: 'function_call', id: `fc_${call.id.replace(/^call_/, '')}`, call_id: call.id, name: call.name, arguments: call.arguments, status };
}

/** A non-streamed response whose text held tool calls: its message (when it said anything), then a function_call item per call. */
export function responseWithCalls(shell: ResponseShell, choice: CollectedChoice, usage: Usage, parsed: ParsedCalls) {
  const status = statusOf(choice.finishReason);
  const items: unknown[] = [];
  if (parsed.content !== null && parsed.content !== '') items.push(shell.message(parsed.content, status === 'incomplete' ? 'incomplete' : 'completed'));
  for (const c of parsed.calls) items.push(callItem({ id: c.id, name: c.function.name, arguments: c.function.arguments }, 'completed'));
  return shell.object(status, undefined, usage, items);
}

type OpenItem = { kind: 'message'; index: number; id: string; text: string } | { kind: 'call'; index: number; call: { id: string; name: string; arguments: string } };

/**
 * The Responses events of a request with function tools: items open as the parser finds them, a
 * message for text (output_text deltas), a function_call item per call
 * (`response.function_call_arguments.delta` pieces, then `.done`), each closed before the next
 * opens; the final response lists them all.
 */
export class ResponsesToolStream implements StreamFormat, ResponseProgress {
  private seq = 0;
  private readonly parser: ToolCallParser;
  private readonly items: unknown[] = [];
  private open: OpenItem | undefined;
  private finish = 'stop';
  private usage: Usage | undefined;
  private readonly announcer: Announcer;

  constructor(
    private readonly shell: ResponseShell,
    syntax: ToolCallSyntax,
    idFor: (index: number) => string,
    private readonly kept = false,
  ) {
    this.parser = new ToolCallParser(syntax, idFor);
    this.announcer = new Announcer(shell);
  }

  private event(type: string, body: Record<string, unknown>): string {
    return responsesEvent(type, this.seq++, body, this.kept);
  }

  announce(): string {
    return this.announcer.announce((type, body) => this.event(type, body));
  }

  opening(): string {
    return this.announce() + this.event('response.in_progress', { response: this.shell.object('in_progress', undefined, undefined) });
  }

  token(_lane: number, text: string): string {
    const events: ToolEvent[] = [];
    this.parser.feed(text, events);
    return this.render(events);
  }

  finished(_lane: number, reason: string): string {
    this.finish = reason;
    const events: ToolEvent[] = [];
    this.parser.end(events);
    return this.render(events) + this.close();
  }

  end(usage: Usage): string {
    this.usage = usage;
    return this.event(`response.${statusOf(this.finish)}`, { response: this.now() });
  }

  now() {
    if (this.usage !== undefined) return this.shell.object(statusOf(this.finish), undefined, this.usage, this.items);
    const open = this.open;
    const current = open === undefined ? [] : open.kind === 'message' ? [{ ...this.shell.message(open.text, 'in_progress'), id: open.id }] : [callItem(open.call, 'in_progress')];
    return this.shell.object('in_progress', undefined, undefined, [...this.items, ...current]);
  }

  error(code: string, message: string): string {
    return this.event('error', errorEventBody(code, message));
  }

  continueFrom(next: number): void {
    this.seq = next;
  }

  private render(events: ToolEvent[]): string {
    let out = '';
    for (const e of events) {
      if (e.kind === 'content') {
        if (this.open?.kind !== 'message') out += this.close() + this.openMessage();
        const open = this.open as Extract<OpenItem, { kind: 'message' }>;
        open.text += e.text;
        out += this.event('response.output_text.delta', { item_id: open.id, output_index: open.index, content_index: 0, delta: e.text, logprobs: [] });
      } else if (e.kind === 'call') {
        out += this.close();
        const call = { id: e.id, name: e.name, arguments: '' };
        this.open = { kind: 'call', index: this.items.length, call };
        out += this.event('response.output_item.added', { output_index: this.open.index, item: callItem(call, 'in_progress') });
      } else if (this.open?.kind === 'call') {
        this.open.call.arguments += e.text;
        out += this.event('response.function_call_arguments.delta', { item_id: callItem(this.open.call, 'in_progress').id, output_index: this.open.index, delta: e.text });
      }
    }
    return out;
  }

  private openMessage(): string {
    const index = this.items.length;
    const id = index === 0 ? this.shell.messageId : `${this.shell.messageId}_${index}`;
    this.open = { kind: 'message', index, id, text: '' };
    return (
      this.event('response.output_item.added', { output_index: index, item: { ...this.shell.message('', 'in_progress'), id } }) +
      this.event('response.content_part.added', { item_id: id, output_index: index, content_index: 0, part: part('') })
    );
  }

  /** Ends the open item: its done events, and it joins the response's output. */
  private close(): string {
    const open = this.open;
    if (open === undefined) return '';
    this.open = undefined;
    if (open.kind === 'message') {
      const item = { ...this.shell.message(open.text, 'completed'), id: open.id };
      this.items.push(item);
      const ids = { item_id: open.id, output_index: open.index, content_index: 0 };
      return (
        this.event('response.output_text.done', { ...ids, text: open.text, logprobs: [] }) +
        this.event('response.content_part.done', { ...ids, part: part(open.text) }) +
        this.event('response.output_item.done', { output_index: open.index, item })
      );
    }
    const item = callItem(open.call, 'completed');
    this.items.push(item);
    return (
      this.event('response.function_call_arguments.done', { item_id: item.id, output_index: open.index, arguments: open.call.arguments }) +
      this.event('response.output_item.done', { output_index: open.index, item })
    );
  }
}
