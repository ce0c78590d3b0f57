import type { TokenLogprob, Usage } from '../../protocol/request-plane.js';
import type { SpliceFrame } from './token-splice.js';
import type { ParsedCalls } from './tool-call-parser.js';

/*
 * What the relay writes to a client, below both the API (which chooses a format per endpoint) and
 * the relay (which drives it): the API's formats implement it, the relay only calls it.
 */

/**
 * One streamed response's wire format, as the relay drives it: chat and completion chunks (api/openai-format.ts),
 * Responses API events (api/responses-format.ts). `lane` is the choice index.
 */
export interface StreamFormat {
  /** Written with the headers, once every lane has a worker. */
  opening(): string;
  /** A token's event; `logprobs` only when the request asked for them (never on the splice path). */
  token(lane: number, text: string, logprobs?: TokenLogprob[]): string;
  /** The token event as bytes around the token's JSON string content, when it has no per-event field. */
  splice?(lane: number): SpliceFrame | undefined;
  /** Resumable streams: the numbering every event's `id:` line takes, spliced events included. */
  readonly ids?: EventIds | undefined;
  /** One choice ended (its finish chunk); the response goes on until every choice has. */
  finished(lane: number, reason: string): string;
  /** Every choice ended: the usage of the whole response and the end marker. */
  end(usage: Usage): string;
  error(code: string, message: string): string;
  /** A takeover: the events made from here on are numbered from `next` (the copy's last id + 1). */
  continueFrom(next: number): void;
}

/** A kept (resumable) stream's event numbering: `id: <n>` before each SSE event, n from 0. */
export class EventIds {
  /** `next`: the first id (a takeover numbers on from the events already sent). */
  constructor(private next = 0) {}

  line(): string {
    return `id: ${this.next++}\n`;
  }

  take(): number {
    return this.next++;
  }

  /** A takeover numbers on from the copy's events. */
  restart(next: number): void {
    this.next = next;
  }
}

/** One collected choice of a non-streaming response. */
export interface CollectedChoice {
  text: string;
  finishReason: string;
  /** With tools: the text parsed into content and calls. */
  tools?: ParsedCalls | undefined;
  /** With logprobs asked: every delivered token's, across the workers that served the choice. */
  logprobs?: TokenLogprob[] | undefined;
}

/**
 * The usage of a response made of several sequences: each distinct prompt counted once (choices of
 * one prompt share it), every completion counted.
 */
export function sumUsage(usages: Usage[], choicesPerPrompt: number): Usage {
  let prompt = 0;
  let completion = 0;
  let cached: number | undefined;
  usages.forEach((u, i) => {
    if (i % choicesPerPrompt === 0) {
      prompt += u.prompt_tokens;
      // The prompt's cached share is counted with the prompt: once, from its first choice.
      if (u.prompt_tokens_details !== undefined) cached = (cached ?? 0) + u.prompt_tokens_details.cached_tokens;
    }
    completion += u.completion_tokens;
  });
  const sum: Usage = { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion };
  if (cached !== undefined) sum.prompt_tokens_details = { cached_tokens: cached };
  return sum;
}
