import type { TokenLogprob } from '../protocol/request-plane.js';
import { topLogprob } from './logprobs.js';

/** How far above the rest the chosen word's logit starts: usually the most likely, not always (as with a sampled model). */
const CHOSEN_LEAD = 3;

/**
 * The mocker's next-word distribution at one position: a logit per vocabulary word drawn from
 * `random` (a stream for that position alone, so the words' own stream is untouched and a
 * continuation sees the same values), the chosen word's raised; reported as log-softmax, with
 * the `top` most likely words, most likely first.
 */
export function mockerLogprob(vocabulary: readonly string[], chosen: number, lead: string, top: number, random: () => number): TokenLogprob {
  const logits = new Float64Array(vocabulary.length);
  let max = -Infinity;
  for (let w = 0; w < logits.length; w++) {
    logits[w] = random() * 4 + (w === chosen ? CHOSEN_LEAD + random() * 3 : 0);
    if ((logits[w] as number) > max) max = logits[w] as number;
  }
  let sum = 0;
  for (const l of logits) sum += Math.exp(l - max);
  const norm = max + Math.log(sum);
  const spelled = (w: number) => lead + (vocabulary[w] as string);
  const chosenEntry = topLogprob(spelled(chosen), (logits[chosen] as number) - norm);
  if (top === 0) return { ...chosenEntry, top_logprobs: [] };
  const ranked = [...logits.keys()].sort((a, b) => (logits[b] as number) - (logits[a] as number) || a - b).slice(0, top);
  return { ...chosenEntry, top_logprobs: ranked.map((w) => topLogprob(spelled(w), (logits[w] as number) - norm)) };
}

/** A piece of a tool call the mocker writes by script: certain (logprob 0), itself its only alternative. */
export function scriptedLogprob(piece: string, top: number): TokenLogprob {
  const entry = topLogprob(piece, 0);
  return { ...entry, top_logprobs: top === 0 ? [] : [entry] };
}
