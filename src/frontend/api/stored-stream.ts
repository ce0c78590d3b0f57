import type { TokenLogprob, Usage } from '../../protocol/request-plane.js';
import type { EventIds, StreamFormat } from '../wire/stream-format.js';

/**
 * A streamed chat completion that is to be stored (`store: true`): its format's events are kept as
 * they are written (the same the client gets), and read back into the completion once its end is
 * written. No splice frame: every token goes through `token`, so every byte is seen.
 */
export class StoredStream implements StreamFormat {
  private readonly events: string[] = [];
  private usage: Usage | undefined;
  private ended = false;

  constructor(private readonly inner: StreamFormat) {}

  get ids(): EventIds | undefined {
    return this.inner.ids;
  }

  opening(): string {
    return this.keep(this.inner.opening());
  }

  token(lane: number, text: string, logprobs?: TokenLogprob[]): string {
    return this.keep(this.inner.token(lane, text, logprobs));
  }

  finished(lane: number, reason: string): string {
    return this.keep(this.inner.finished(lane, reason));
  }

  end(usage: Usage): string {
    this.usage = usage;
    this.ended = true;
    return this.keep(this.inner.end(usage));
  }

  error(code: string, message: string): string {
    return this.inner.error(code, message);
  }

  continueFrom(next: number): void {
    this.inner.continueFrom(next);
  }

  /** The chat.completion the stream made, once it ended whole (undefined for one that did not). */
  completion(): Record<string, unknown> | undefined {
    return this.ended ? completionFromChunks(this.events.join(''), this.usage) : undefined;
  }

  private keep(out: string): string {
    this.events.push(out);
    return out;
  }
}

interface Chunk {
  id: string;
  created: number;
  model: string;
  service_tier?: string;
  choices: Array<{
    index: number;
    delta?: { content?: string | null; tool_calls?: Array<{ index: number; id?: string; function?: { name?: string; arguments?: string } }>; function_call?: { name?: string; arguments?: string } };
    logprobs?: { content?: TokenLogprob[] | null } | null;
    finish_reason?: string | null;
  }>;
  usage?: Usage | null;
}

type Call = { id: string; type: 'function'; function: { name: string; arguments: string } };

/**
 * A chat stream's chunks (SSE text, `id:` lines and all) read back into the chat.completion a
 * non-streamed request gets: each choice's content, tool calls (their pieces joined, as the SDKs
 * join them) or legacy function call, logprobs and finish reason; `usage` where the stream's end
 * gave it. Undefined when no chunk is there.
 */
export function completionFromChunks(events: string, usage?: Usage): Record<string, unknown> | undefined {
  let head: Chunk | undefined;
  const choices = new Map<number, { content: string | null; calls: Call[]; fn?: { name: string; arguments: string }; logprobs?: TokenLogprob[]; finish: string | null }>();
  for (const event of events.split('\n\n')) {
    const data = event.split('\n').find((l) => l.startsWith('data: '))?.slice('data: '.length);
    if (data === undefined || data === '[DONE]') continue;
    const chunk = JSON.parse(data) as Chunk;
    head ??= chunk;
    if (chunk.usage != null) usage = chunk.usage;
    for (const c of chunk.choices ?? []) {
      let choice = choices.get(c.index);
      if (choice === undefined) choices.set(c.index, (choice = { content: null, calls: [], finish: null }));
      const d = c.delta ?? {};
      if (typeof d.content === 'string') choice.content = (choice.content ?? '') + d.content;
      for (const t of d.tool_calls ?? []) {
        const call = (choice.calls[t.index] ??= { id: '', type: 'function', function: { name: '', arguments: '' } });
        if (t.id !== undefined) call.id = t.id;
        if (t.function?.name !== undefined) call.function.name = t.function.name;
        call.function.arguments += t.function?.arguments ?? '';
      }
      if (d.function_call !== undefined) {
        choice.fn ??= { name: '', arguments: '' };
        if (d.function_call.name !== undefined) choice.fn.name = d.function_call.name;
        choice.fn.arguments += d.function_call.arguments ?? '';
      }
      if (c.logprobs?.content != null) choice.logprobs = [...(choice.logprobs ?? []), ...c.logprobs.content];
      if (c.finish_reason != null) choice.finish = c.finish_reason;
    }
  }
  if (head === undefined) return undefined;
  return {
    id: head.id,
    object: 'chat.completion',
    created: head.created,
    model: head.model,
    ...(head.service_tier !== undefined && { service_tier: head.service_tier }),
    choices: [...choices.entries()]
      .sort(([a], [b]) => a - b)
      .map(([index, c]) => ({
        index,
        message: {
          role: 'assistant',
          // Only calls: content null, as a non-streamed answer's.
          content: c.content ?? (c.calls.length > 0 || c.fn !== undefined ? null : ''),
          refusal: null,
          ...(c.calls.length > 0 && { tool_calls: c.calls }),
          ...(c.fn !== undefined && { function_call: c.fn }),
        },
        logprobs: c.logprobs === undefined ? null : { content: c.logprobs, refusal: null },
        finish_reason: c.finish,
      })),
    usage: usage ?? null,
  };
}
