import { TokenBias, type LlamaContextSequenceRepeatPenalty, type LlamaModel, type Token } from 'node-llama-cpp';
import { EbbError } from '../protocol/errors.js';
import type { Sampling } from '../protocol/sampling.js';

/** node-llama-cpp's sampling defaults are not OpenAI's: no top-k unless asked. */
const NO_TOP_K = 0;

/** What node-llama-cpp's evaluate takes for a request's sampling fields. */
export interface LlamaSamplingOptions {
  topK: number;
  minP: number;
  repeatPenalty?: LlamaContextSequenceRepeatPenalty;
  tokenBias?: TokenBias;
}

/**
 * OpenAI's penalties and logit_bias, and vLLM's extras, through llama.cpp's own samplers:
 * frequency_penalty and presence_penalty are its penalties sampler's, repetition_penalty its
 * repeat penalty (a seen token's logit divided by it, or multiplied when negative, as vLLM's), all
 * three over the answer's tokens so far (`answer`: a continuation's tokens first, so a continued
 * answer samples as it would have on one worker; read each time a token is sampled); logit_bias is
 * added to the logits of those token ids; top_k and min_p as llama.cpp's.
 *
 * Checked before anything runs: a logit_bias id outside the vocabulary would be written past
 * llama.cpp's logits (it does not check), and node-llama-cpp silently drops a bias on an
 * end-of-generation token, so both are refused naming logit_bias.
 */
export function llamaSampling(model: LlamaModel, vocabularySize: number | undefined, sampling: Sampling | undefined, answer: readonly Token[], contextSize: number): LlamaSamplingOptions {
  const out: LlamaSamplingOptions = { topK: sampling?.top_k !== undefined && sampling.top_k > 0 ? sampling.top_k : NO_TOP_K, minP: sampling?.min_p ?? 0 };
  if (sampling === undefined) return out;
  const { frequency_penalty, presence_penalty, repetition_penalty, logit_bias } = sampling;
  if (frequency_penalty !== undefined || presence_penalty !== undefined || repetition_penalty !== undefined)
    out.repeatPenalty = {
      punishTokens: () => answer as Token[],
      // The whole answer (up to the context), fixed: a changing bound makes node-llama-cpp rebuild the sampler per token.
      maxPunishTokens: contextSize,
      penalty: repetition_penalty ?? 1,
      frequencyPenalty: frequency_penalty ?? 0,
      presencePenalty: presence_penalty ?? 0,
    };
  if (logit_bias !== undefined) {
    const bias = new TokenBias(model.tokenizer);
    for (const [key, value] of Object.entries(logit_bias)) {
      const id = Number(key);
      if (vocabularySize === undefined) throw new EbbError('unsupported_parameter', 'logit_bias is not supported: this model does not say its vocabulary size, so its token ids cannot be checked', { param: 'logit_bias' });
      if (!Number.isSafeInteger(id) || id >= vocabularySize) throw new EbbError('invalid_request', `Invalid key in 'logit_bias': ${key}. Maximum value is ${vocabularySize - 1}.`, { param: 'logit_bias' });
      if (model.isEogToken(id as Token)) throw new EbbError('unsupported_parameter', `logit_bias on token ${key} is not supported: it ends the generation, and llama-cpp does not bias that token`, { param: 'logit_bias' });
      if (value !== 0) bias.set(id as Token, { logit: value });
    }
    out.tokenBias = bias;
  }
  return out;
}
