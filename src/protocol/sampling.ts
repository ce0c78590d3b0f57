/**
 * The sampling parameters beyond temperature, top_p and seed: OpenAI's penalties and logit_bias, and
 * the extras vLLM and SGLang accept (repetition_penalty, top_k, min_p). One table of their bounds
 * and of the value that changes nothing, read by the public API's schemas, the request plane's, the
 * field policy and every engine. A request carries only the ones that change the answer; an engine
 * that honours them declares the `sampling` capability (capabilities.ts).
 */

export const SAMPLING_FIELDS = ['frequency_penalty', 'presence_penalty', 'repetition_penalty', 'logit_bias', 'top_k', 'min_p'] as const;
export type SamplingField = (typeof SAMPLING_FIELDS)[number];

/** Token ids (of the model's own tokenizer, as decimal strings) and what is added to their logits: OpenAI's shape. */
export type LogitBias = Record<string, number>;

export interface Sampling {
  /** Subtracted from a token's logit once per time it was generated so far (OpenAI: -2..2). */
  frequency_penalty?: number | undefined;
  /** Subtracted from a token's logit once it was generated at all (OpenAI: -2..2). */
  presence_penalty?: number | undefined;
  /** vLLM's and SGLang's: a token already seen has its logit divided by it (positive) or multiplied (negative); 1 is none. */
  repetition_penalty?: number | undefined;
  logit_bias?: LogitBias | undefined;
  /** Only the k most likely tokens are sampled from; 0 or -1 (vLLM's) is every token. */
  top_k?: number | undefined;
  /** Tokens less likely than min_p times the most likely one are left out. */
  min_p?: number | undefined;
}

/** OpenAI's bound on logit_bias entries is its tokenizer's; ebb's keeps a request's work bounded. */
export const MAX_LOGIT_BIAS_ENTRIES = 1024;
/** A token id as a logit_bias key: digits, as OpenAI's SDKs send them. */
export const LOGIT_BIAS_KEY = '^[0-9]{1,10}$';

/** Each number field's JSON Schema bounds (the public API's and the request plane's alike). */
export const SAMPLING_BOUNDS = {
  frequency_penalty: { type: 'number', minimum: -2, maximum: 2 },
  presence_penalty: { type: 'number', minimum: -2, maximum: 2 },
  repetition_penalty: { type: 'number', exclusiveMinimum: 0, maximum: 2 },
  top_k: { type: 'integer', minimum: -1, maximum: 1_000_000 },
  min_p: { type: 'number', minimum: 0, maximum: 1 },
} as const;

export const LOGIT_BIAS_SCHEMA = {
  type: 'object',
  maxProperties: MAX_LOGIT_BIAS_ENTRIES,
  propertyNames: { pattern: LOGIT_BIAS_KEY },
  additionalProperties: { type: 'number', minimum: -100, maximum: 100 },
} as const;

/** Whether a field's value changes nothing: unset, or what an engine does without it. */
export function isNeutral(field: SamplingField, value: unknown): boolean {
  if (value === undefined || value === null) return true;
  switch (field) {
    case 'frequency_penalty':
    case 'presence_penalty':
    case 'min_p':
      return value === 0;
    case 'repetition_penalty':
      return value === 1;
    case 'top_k':
      return value === 0 || value === -1;
    case 'logit_bias':
      return typeof value === 'object' && Object.values(value as object).every((v) => v === 0);
  }
}

/** The request's sampling fields that change its answer, as the request plane carries them; undefined when none does. */
export function samplingOf(body: Readonly<Record<string, unknown>>): Sampling | undefined {
  let out: Record<string, unknown> | undefined;
  for (const field of SAMPLING_FIELDS) {
    const value = body[field];
    if (!isNeutral(field, value)) (out ??= {})[field] = value;
  }
  return out as Sampling | undefined;
}

/** Whether a request-plane body carries any (the hot path: a plain request carries none). */
export function carriesSampling(body: Sampling): boolean {
  return body.frequency_penalty !== undefined || body.presence_penalty !== undefined || body.repetition_penalty !== undefined || body.logit_bias !== undefined || body.top_k !== undefined || body.min_p !== undefined;
}
