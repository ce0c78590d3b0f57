import { promptOf, type GenerateBody } from '../../protocol/request-plane.js';
import { countsTokens, type TenantLimits } from './tenant-limits.js';

/** What a limited request without max_tokens may generate at most: its reservation, and its bound. */
export const LIMITED_DEFAULT_MAX_TOKENS = 4096;

/** About four characters a token: the queue's estimate too (ticket.ts), cheap and engine-independent. */
export function promptTokens(gen: GenerateBody): number {
  return Math.ceil((promptOf(gen)?.length ?? 0) / 4);
}

/**
 * The tokens a request reserves of its tenant's token limits: each distinct prompt's estimate once
 * (its `n` choices share it, as usage counts it) and every sequence's max_tokens. A sequence
 * without max_tokens is given one, so its answer can never cross what was reserved for it: the
 * smaller of LIMITED_DEFAULT_MAX_TOKENS and the tightest token limit less its prompt (at least 1);
 * its answer then ends with finish_reason `length` there. 0 (and no bound) where no token limit applies.
 */
export function reserveTokens(gens: readonly GenerateBody[], n: number, limits: TenantLimits): number {
  if (!countsTokens(limits)) return 0;
  const tightest = Math.min(limits.tokens_per_minute ?? Infinity, limits.tokens_per_day ?? Infinity, limits.tokens_per_month ?? Infinity);
  let total = 0;
  gens.forEach((gen, i) => {
    const prompt = promptTokens(gen);
    if (i % n === 0) total += prompt;
    gen.max_tokens ??= Math.max(1, Math.min(LIMITED_DEFAULT_MAX_TOKENS, tightest - prompt));
    total += gen.max_tokens;
  });
  return total;
}
