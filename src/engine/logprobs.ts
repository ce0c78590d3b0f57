import type { TopLogprob } from '../protocol/request-plane.js';

/**
 * What OpenAI reports for a probability too small to represent: a finite logprob, since JSON has
 * no -Infinity (JSON.stringify would write null, which the SDKs' types do not allow).
 */
export const LOGPROB_FLOOR = -9999;

/** A candidate token as the client sees it: its text, its natural-log probability (finite, <= 0), its UTF-8 bytes. */
export function topLogprob(token: string, logprob: number): TopLogprob {
  return { token, logprob: Number.isFinite(logprob) ? Math.min(0, Math.max(LOGPROB_FLOOR, logprob)) : LOGPROB_FLOOR, bytes: [...Buffer.from(token, 'utf8')] };
}
