import type { LlamaModel, SequenceEvaluateMetadataOptions, Token } from 'node-llama-cpp';
import type { TokenLogprob, TopLogprob } from '../protocol/request-plane.js';
import type { TokenBytes } from './llama-cpp-token-bytes.js';
import { CONTEXT_TOKENS, type AssembledPiece } from './llama-cpp-text.js';
import { topLogprob } from './logprobs.js';
import { scriptedLogprob } from './mocker-logprobs.js';

/** One sampled token with what node-llama-cpp measured of it (evaluateWithMetadata). */
export interface SampledToken {
  token: Token;
  /** The chosen token's probability (asked when no alternatives are). */
  confidence?: number;
  /** Every candidate's probability, most likely first (asked for alternatives). */
  probabilities?: Map<Token, number>;
}

/**
 * What node-llama-cpp must measure per token: nothing without logprobs; the chosen token's
 * probability alone for top_logprobs 0 (cheap); the whole distribution for alternatives (a
 * vocabulary-sized map per token, so only when asked).
 */
export function samplingMetadata(top: number | undefined): SequenceEvaluateMetadataOptions {
  return top === undefined ? {} : top === 0 ? { confidence: true } : { probabilities: true };
}

/**
 * A generation's logprobs: each sampled token's entry is made as it is sampled (its
 * alternatives detokenized after the same tokens as it), and handed out with the piece that
 * carries the token. Pieces carry the sampled tokens in order, so entries are taken in order.
 *
 * The probabilities are those llama.cpp samples from: after temperature and the grammar of a
 * structured answer (a token the grammar forbids has none, and is never listed).
 */
export class LlamaLogprobs {
  private recent: Token[];
  private readonly entries: TokenLogprob[] = [];

  constructor(
    private readonly model: LlamaModel,
    private readonly bytesOf: TokenBytes,
    private readonly top: number,
    before: readonly Token[],
  ) {
    this.recent = before.slice(-CONTEXT_TOKENS);
  }

  /** Records a token as it is sampled, before it goes to the piece assembler. */
  sampled(s: SampledToken): void {
    const candidate = (t: Token, p: number): TopLogprob => {
      const c = topLogprob(this.model.detokenize([t], false, this.recent), Math.log(p));
      const own = this.bytesOf(t);
      if (own !== undefined) c.bytes = own;
      return c;
    };
    const top_logprobs: TopLogprob[] = [];
    if (s.probabilities !== undefined)
      for (const [t, q] of s.probabilities) {
        if (top_logprobs.length >= this.top || q <= 0) break;
        top_logprobs.push(candidate(t, q));
      }
    this.entries.push({ ...candidate(s.token, s.confidence ?? s.probabilities?.get(s.token) ?? 0), top_logprobs });
    this.recent = [...this.recent, s.token].slice(-CONTEXT_TOKENS);
  }

  /**
   * Tokens the engine wrote itself (a forced tool call's opening, params prefix, suffix): certain,
   * each its only alternative. Entries sampled but never handed out (cut by a stop) go first.
   */
  written(tokens: readonly Token[]): void {
    this.entries.length = 0;
    for (const t of tokens) {
      this.entries.push(scriptedLogprob(this.model.detokenize([t], true, this.recent), this.top));
      this.recent = [...this.recent, t].slice(-CONTEXT_TOKENS);
    }
  }

  /** The piece with the entries of its tokens. */
  attach(piece: AssembledPiece): AssembledPiece & { logprobs: TokenLogprob[] } {
    return { ...piece, logprobs: this.entries.splice(0, piece.token_ids.length) };
  }
}
