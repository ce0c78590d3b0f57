import type { TokenLogprob, Usage } from '../../protocol/request-plane.js';
import type { ToolCallSyntax } from '../../protocol/tools.js';
import { ToolCallParser, type ToolEvent } from '../wire/tool-call-parser.js';
import type { StreamFormat } from '../wire/stream-format.js';
import type { SseFormatter } from './openai-format.js';

/**
 * A chat stream whose request has tools: each choice's raw text goes through a ToolCallParser, and
 * comes out as content deltas and `delta.tool_calls` pieces (index, id, name, then arguments), as
 * the openai SDK and the Vercel AI SDK assemble them. A choice that called a tool and stopped
 * finishes with `tool_calls`. No splice frame: every piece is parsed. A request that sent legacy
 * `functions` gets the legacy pieces: `delta.function_call` (name, then arguments) of its one call,
 * finishing with `function_call`.
 */
export class ToolCallStream implements StreamFormat {
  private readonly parsers: ToolCallParser[];
  /** Logprobs of text not yet emitted (held by the parser), per choice. */
  private readonly pending: Array<TokenLogprob[] | undefined> = [];

  constructor(
    private readonly inner: SseFormatter,
    syntax: ToolCallSyntax,
    idsFor: (lane: number) => (index: number) => string,
    lanes: number,
    private readonly legacy = false,
  ) {
    this.parsers = Array.from({ length: lanes }, (_, lane) => new ToolCallParser(syntax, idsFor(lane)));
  }

  opening(): string {
    return this.inner.opening();
  }

  token(lane: number, text: string, logprobs?: TokenLogprob[]): string {
    const events: ToolEvent[] = [];
    this.parsers[lane]!.feed(text, events);
    // A piece's logprobs go with its first chunk; held text (a possible call's start) passes them on.
    if (logprobs !== undefined) this.pending[lane] = [...(this.pending[lane] ?? []), ...logprobs];
    return this.render(lane, events);
  }

  finished(lane: number, reason: string): string {
    const parser = this.parsers[lane]!;
    const events: ToolEvent[] = [];
    parser.end(events);
    const finish = finishWithCalls(reason, parser.called);
    return this.render(lane, events) + this.inner.finished(lane, this.legacy && finish === 'tool_calls' ? 'function_call' : finish);
  }

  end(usage: Usage): string {
    return this.inner.end(usage);
  }

  error(code: string, message: string): string {
    return this.inner.error(code, message);
  }

  continueFrom(next: number): void {
    this.inner.continueFrom(next);
  }

  private render(lane: number, events: ToolEvent[]): string {
    let out = '';
    for (const e of events) {
      const logprobs = this.pending[lane];
      this.pending[lane] = undefined;
      if (e.kind === 'content') out += this.inner.token(lane, e.text, logprobs);
      else if (this.legacy) {
        // One call is the legacy answer's (parallel calls were not asked for): a model's second is not part of it.
        if (e.index !== 0) continue;
        out += this.inner.delta(lane, e.kind === 'call' ? `{"function_call":{"name":${JSON.stringify(e.name)},"arguments":""}}` : `{"function_call":{"arguments":${JSON.stringify(e.text)}}}`, logprobs);
      } else if (e.kind === 'call')
        out += this.inner.delta(lane, `{"tool_calls":[{"index":${e.index},"id":${JSON.stringify(e.id)},"type":"function","function":{"name":${JSON.stringify(e.name)},"arguments":""}}]}`, logprobs);
      else out += this.inner.delta(lane, `{"tool_calls":[{"index":${e.index},"function":{"arguments":${JSON.stringify(e.text)}}}]}`, logprobs);
    }
    return out;
  }
}

/** An answer that called a tool and then stopped asks for the results: OpenAI's `tool_calls`. */
export function finishWithCalls(reason: string, calls: number): string {
  return calls > 0 && reason === 'stop' ? 'tool_calls' : reason;
}
