import type { Sampling } from '../protocol/sampling.js';
import type { EngineKind } from './openai-engine-options.js';

/**
 * Penalties, logit_bias and the extras, as the engine server takes them: vLLM and SGLang under
 * these names (their OpenAI routes accept repetition_penalty, top_k and min_p beside OpenAI's own);
 * llama-server names the repetition penalty repeat_penalty. A generic server gets OpenAI's names
 * and answers for what it does not know (its 400 reaches the client).
 */
export function engineSamplingFields(kind: EngineKind, sampling: Sampling | undefined): Record<string, unknown> {
  if (sampling === undefined) return {};
  const { repetition_penalty, ...rest } = sampling;
  const out: Record<string, unknown> = { ...rest };
  if (repetition_penalty !== undefined) out[kind === 'llamacpp' ? 'repeat_penalty' : 'repetition_penalty'] = repetition_penalty;
  return out;
}
