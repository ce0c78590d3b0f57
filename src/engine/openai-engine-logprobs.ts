import type { TokenLogprob, TopLogprob } from '../protocol/request-plane.js';
import { topLogprob } from './logprobs.js';

/** The request fields that ask an engine server for logprobs, as each endpoint spells them. */
export function logprobsFields(chat: boolean, top: number | undefined): Record<string, unknown> {
  if (top === undefined) return {};
  return chat ? { logprobs: true, top_logprobs: top } : { logprobs: top };
}

interface ChatEntry {
  token?: unknown;
  logprob?: unknown;
  bytes?: unknown;
  top_logprobs?: unknown;
}

interface CompletionLogprobs {
  tokens?: unknown;
  token_logprobs?: unknown;
  top_logprobs?: unknown;
}

const isBytes = (b: unknown): b is number[] => Array.isArray(b) && b.every((x) => Number.isInteger(x) && x >= 0 && x < 256);

/** An engine's candidate, made finite and <= 0; its own bytes kept where it sent them (a token that is part of a character has no text of its own). */
function candidate(e: ChatEntry): TopLogprob | undefined {
  if (typeof e?.token !== 'string') return undefined;
  const out = topLogprob(e.token, typeof e.logprob === 'number' ? e.logprob : Number.NaN);
  if (isBytes(e.bytes)) out.bytes = e.bytes;
  return out;
}

/**
 * The logprobs of one streamed chunk, in the request plane's shape: chat's `logprobs.content`
 * (already that shape, checked), or completions' parallel arrays (`tokens`, `token_logprobs`, and
 * `top_logprobs` as token → logprob maps, which vLLM fills with the sampled token besides the
 * `top` most likely: sorted here and cut to `top`). Undefined when the chunk has none.
 */
export function chunkLogprobs(chat: boolean, raw: unknown, top: number): TokenLogprob[] | undefined {
  if (typeof raw !== 'object' || raw === null) return undefined;
  const out: TokenLogprob[] = [];
  if (chat) {
    const content = (raw as { content?: unknown }).content;
    if (!Array.isArray(content)) return undefined;
    for (const e of content as ChatEntry[]) {
      const chosen = candidate(e);
      if (chosen === undefined) continue;
      const alternatives = Array.isArray(e.top_logprobs) ? (e.top_logprobs as ChatEntry[]).map(candidate).filter((c) => c !== undefined) : [];
      out.push({ ...chosen, top_logprobs: alternatives.slice(0, top) });
    }
  } else {
    const { tokens, token_logprobs, top_logprobs } = raw as CompletionLogprobs;
    if (!Array.isArray(tokens)) return undefined;
    const tops = Array.isArray(top_logprobs) ? top_logprobs : [];
    tokens.forEach((token, i) => {
      const chosen = candidate({ token, logprob: Array.isArray(token_logprobs) ? token_logprobs[i] : undefined });
      if (chosen === undefined) return;
      const map = tops[i];
      const alternatives = typeof map === 'object' && map !== null ? Object.entries(map as Record<string, unknown>).map(([t, l]) => candidate({ token: t, logprob: l })).filter((c) => c !== undefined) : [];
      alternatives.sort((a, b) => b.logprob - a.logprob);
      out.push({ ...chosen, top_logprobs: alternatives.slice(0, top) });
    });
  }
  return out.length > 0 ? out : undefined;
}
