import type { TokenLogprob, TopLogprob } from '../protocol/request-plane.js';
import type { EngineKind } from './openai-engine-options.js';
import { topLogprob } from './logprobs.js';

/**
 * The request fields that ask an engine server for logprobs, as each endpoint spells them.
 * llama-server reports none when asked for no alternatives (its n_probs 0): it is asked for one,
 * and the alternatives are cut back to `top` (chunkLogprobs).
 */
export function logprobsFields(kind: EngineKind, chat: boolean, top: number | undefined): Record<string, unknown> {
  if (top === undefined) return {};
  const asked = kind === 'llamacpp' ? Math.max(1, top) : top;
  return chat ? { logprobs: true, top_logprobs: asked } : { logprobs: asked };
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
 * The logprobs of one streamed chunk, in the request plane's shape, from either shape an engine
 * answers in: chat's `logprobs.content` (already that shape, checked; llama-server answers
 * completions in it too), or completions' parallel arrays (`tokens`, `token_logprobs`, and
 * `top_logprobs` as token → logprob maps, which vLLM fills with the sampled token besides the
 * `top` most likely: sorted here). Alternatives are cut to `top`. Undefined when the chunk has none.
 */
export function chunkLogprobs(raw: unknown, top: number): TokenLogprob[] | undefined {
  if (typeof raw !== 'object' || raw === null) return undefined;
  const out: TokenLogprob[] = [];
  const content = (raw as { content?: unknown }).content;
  const add = (chosen: TopLogprob | undefined, alternatives: TopLogprob[]) => {
    if (chosen === undefined) return;
    alternatives.sort((a, b) => b.logprob - a.logprob);
    out.push({ ...chosen, top_logprobs: alternatives.slice(0, top) });
  };
  if (Array.isArray(content)) {
    for (const e of content as ChatEntry[]) add(candidate(e), Array.isArray(e.top_logprobs) ? (e.top_logprobs as ChatEntry[]).map(candidate).filter((c) => c !== undefined) : []);
  } else {
    const { tokens, token_logprobs, top_logprobs } = raw as CompletionLogprobs;
    if (!Array.isArray(tokens)) return undefined;
    const tops = Array.isArray(top_logprobs) ? top_logprobs : [];
    tokens.forEach((token, i) => {
      const map = tops[i];
      const alternatives = typeof map === 'object' && map !== null ? Object.entries(map as Record<string, unknown>).map(([t, l]) => candidate({ token: t, logprob: l })) : [];
      add(candidate({ token, logprob: Array.isArray(token_logprobs) ? token_logprobs[i] : undefined }), alternatives.filter((c) => c !== undefined));
    });
  }
  return out.length > 0 ? out : undefined;
}
