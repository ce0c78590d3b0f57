import { EbbError } from '../protocol/errors.js';
import { MOCKER_VOCAB_SIZE, mockerTokenIds } from '../protocol/mocker-tokenizer.js';
import type { Sampling } from '../protocol/sampling.js';

/**
 * The mocker's sampling parameters, with the effect a model's would have, deterministically. Its
 * words are equally likely (every logit BASE_LOGIT); from there each field acts as an engine's does:
 * logit_bias is added to the logit of the word with that token id (mocker-tokenizer.ts),
 * frequency_penalty and presence_penalty subtract as OpenAI defines them for the words generated so
 * far, repetition_penalty divides the logit of a word seen in the prompt or the answer (multiplies,
 * where it is negative), as vLLM's does; then top_k keeps the k likeliest words and min_p drops those
 * below min_p times the likeliest. The word is drawn from what is left with the position's own
 * random number, so the same prompt, seed and fields give the same answer on every worker, and a
 * continuation that replays the delivered words through the same sampler goes on as one worker would.
 */
/** Every word's logit before the fields act: equal (so the draw is the plain one), and large enough that dividing it (repetition_penalty) tells. */
const BASE_LOGIT = 4;

export class MockerSampler {
  /** Times each vocabulary word was generated so far. */
  private readonly counts: Uint32Array;
  /** Words whose token is in the prompt (what repetition_penalty counts besides the answer). */
  private readonly inPrompt: Uint8Array;
  private readonly bias: Float64Array;

  constructor(
    private readonly vocabulary: readonly string[],
    private readonly sampling: Sampling,
    prompt: string,
  ) {
    this.counts = new Uint32Array(vocabulary.length);
    this.inPrompt = new Uint8Array(vocabulary.length);
    this.bias = new Float64Array(vocabulary.length);
    const ids = vocabulary.map((w) => mockerTokenIds(w)[0]!);
    const seen = new Set(mockerTokenIds(prompt));
    ids.forEach((id, w) => (this.inPrompt[w] = seen.has(id) ? 1 : 0));
    for (const [key, value] of Object.entries(sampling.logit_bias ?? {})) {
      const id = Number(key);
      // Token ids past the tokenizer's range are no token at all: refused as OpenAI refuses them.
      if (!Number.isSafeInteger(id) || id >= MOCKER_VOCAB_SIZE) throw new EbbError('invalid_request', `Invalid key in 'logit_bias': ${key}. Maximum value is ${MOCKER_VOCAB_SIZE - 1}.`, { param: 'logit_bias' });
      ids.forEach((wordId, w) => {
        if (wordId === id) this.bias[w] = value;
      });
    }
  }

  /** The next word (its vocabulary index), drawn with `random` at its position; counted for the penalties that follow. */
  pick(random: () => number): number {
    const { frequency_penalty = 0, presence_penalty = 0, repetition_penalty = 1, top_k, min_p = 0 } = this.sampling;
    const n = this.vocabulary.length;
    const logits = new Float64Array(n);
    for (let w = 0; w < n; w++) {
      const count = this.counts[w]!;
      let l = BASE_LOGIT;
      if ((count > 0 || this.inPrompt[w] === 1) && repetition_penalty !== 1) l = l > 0 ? l / repetition_penalty : l * repetition_penalty;
      logits[w] = l + this.bias[w]! - frequency_penalty * count - (count > 0 ? presence_penalty : 0);
    }
    // Likeliest first (ties: vocabulary order), so top_k and min_p cut the same words everywhere.
    const order = [...logits.keys()].sort((a, b) => logits[b]! - logits[a]! || a - b);
    const kept = top_k !== undefined && top_k > 0 ? order.slice(0, top_k) : order;
    const max = logits[kept[0]!]!;
    const weights = kept.map((w) => Math.exp(logits[w]! - max));
    const total = weights.reduce((a, b) => a + b, 0);
    const floor = min_p * (weights[0]! / total);
    let sum = 0;
    for (let i = 0; i < kept.length; i++) if (weights[i]! / total >= floor) sum += weights[i]!;
    let r = random() * sum;
    let chosen = kept[0]!;
    for (let i = 0; i < kept.length; i++) {
      if (weights[i]! / total < floor) continue;
      chosen = kept[i]!;
      r -= weights[i]!;
      if (r < 0) break;
    }
    this.counts[chosen] = this.counts[chosen]! + 1;
    return chosen;
  }
}
