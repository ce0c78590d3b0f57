import type { EmbedInput, TokenizeRequest } from '../engine/engine.js';
import { EbbError } from '../protocol/errors.js';

/** OpenAI's bound on one embeddings request: 300,000 tokens summed across its inputs (--max-embedding-tokens' default). */
export const DEFAULT_MAX_EMBEDDING_TOKENS = 300_000;

/**
 * A token covers at least one byte of its text; an input adds at most a few of its own (BOS, EOS, a
 * leading-space piece). So a text's bytes plus these bound its tokens from above, whatever the tokenizer.
 */
const EXTRA_TOKENS_PER_INPUT = 4;

type Tokenize = (req: TokenizeRequest, signal: AbortSignal) => Promise<number[]>;

/**
 * Refuses an embedding request whose inputs carry more than `max` tokens, before any is embedded:
 * 400 naming `input`, in OpenAI's words. Token ids count as themselves; texts are counted by the
 * engine's tokenizer only when their bytes could put the request past the bound, so a request well
 * under it costs no tokenizing. An engine that cannot tokenize has its texts counted by that upper
 * bound (fail closed: the bound is what keeps one request from holding a slot for minutes).
 */
export async function checkEmbeddingTokens(inputs: readonly EmbedInput[], max: number, tokenize: Tokenize | undefined, signal: AbortSignal): Promise<void> {
  let exact = 0;
  let upper = 0;
  const texts: string[] = [];
  for (const input of inputs) {
    if (typeof input === 'string') {
      upper += Buffer.byteLength(input) + EXTRA_TOKENS_PER_INPUT;
      texts.push(input);
    } else exact += input.length;
  }
  if (exact + upper <= max) return;
  if (exact <= max && tokenize !== undefined) {
    try {
      for (const prompt of texts) exact += (await tokenize({ prompt }, signal)).length;
      upper = 0;
    } catch (err) {
      if (signal.aborted) throw err;
      // Its server has no tokenizer to ask (a generic engine): the bytes' bound stands.
    }
  }
  const requested = exact + upper;
  if (requested <= max) return;
  const counted = upper === 0 ? '' : ' (its texts counted as UTF-8 bytes: the engine cannot tokenize them)';
  throw new EbbError('invalid_request', `Requested ${requested} tokens, max ${max} tokens per request${counted}; split the inputs over several requests`, { param: 'input' });
}
