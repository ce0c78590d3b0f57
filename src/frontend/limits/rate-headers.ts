import { EbbError, type ErrorBody } from '../../protocol/errors.js';
import type { Answer, TenantUsage } from './limit-store.js';
import type { LimitName, TenantLimits } from './tenant-limits.js';

/** A duration as OpenAI's x-ratelimit-reset-* headers write it (Go's form): 20ms, 1.5s, 6m0s, 1h2m3s. */
export function resetText(ms: number): string {
  const whole = Math.max(0, Math.round(ms));
  if (whole < 1000) return `${whole}ms`;
  const h = Math.floor(whole / 3_600_000);
  const m = Math.floor((whole % 3_600_000) / 60_000);
  const s = (whole % 60_000) / 1000;
  const sec = `${Number.isInteger(s) ? s : s.toFixed(3).replace(/0+$/, '')}s`;
  return h > 0 ? `${h}h${m}m${sec}` : m > 0 ? `${m}m${sec}` : sec;
}

/**
 * OpenAI's rate-limit headers for a tenant's per-minute limits, as they stand after this request:
 * x-ratelimit-{limit,remaining,reset}-{requests,tokens} (reset: until the minute's window is empty
 * again). Only the limits the tenant has; none for a tenant with none of them.
 */
export function rateHeaders(limits: TenantLimits, usage: TenantUsage): Record<string, string> {
  const out: Record<string, string> = {};
  const reset = resetText(usage.resetMs);
  const rpm = limits.requests_per_minute;
  if (rpm !== undefined) {
    out['x-ratelimit-limit-requests'] = String(rpm);
    out['x-ratelimit-remaining-requests'] = String(Math.max(0, rpm - usage.requests));
    out['x-ratelimit-reset-requests'] = reset;
  }
  const tpm = limits.tokens_per_minute;
  if (tpm !== undefined) {
    out['x-ratelimit-limit-tokens'] = String(tpm);
    out['x-ratelimit-remaining-tokens'] = String(Math.max(0, tpm - usage.tokens));
    out['x-ratelimit-reset-tokens'] = reset;
  }
  return out;
}

const WORDS: Record<LimitName, string> = {
  requests_per_minute: 'requests per minute',
  tokens_per_minute: 'tokens per minute',
  concurrent_streams: 'concurrent streams',
  tokens_per_day: 'tokens per day (UTC)',
  tokens_per_month: 'tokens per month (UTC)',
};

/**
 * A tenant's request refused by one of its limits: 429 `rate_limit_exceeded` (a rate: requests or
 * tokens per minute, concurrent streams) or `insufficient_quota` (a budget: tokens per day or
 * month), naming the limit (the message, and `limit` in the body), with Retry-After (and
 * retry-after-ms, which OpenAI's SDKs read first) from when the window frees enough for it. Where
 * no wait helps (it asks for more than the limit) or a retry within the period cannot (a budget),
 * x-should-retry: false keeps the SDKs from retrying on their own.
 */
export class LimitRefusal extends EbbError {
  constructor(
    readonly tenant: string,
    readonly limit: LimitName,
    limits: TenantLimits,
    answer: Extract<Answer, { ok: false }>,
    tokens: number,
  ) {
    const budget = limit === 'tokens_per_day' || limit === 'tokens_per_month';
    const value = limits[limit]!;
    const used = { requests_per_minute: answer.usage.requests, tokens_per_minute: answer.usage.tokens, concurrent_streams: answer.usage.streams, tokens_per_day: answer.usage.day, tokens_per_month: answer.usage.month }[limit];
    const requested = limit === 'requests_per_minute' || limit === 'concurrent_streams' ? 1 : tokens;
    const retryMs = answer.retryMs ?? (limit === 'concurrent_streams' ? 1000 : null);
    const headers: Record<string, string> = { ...rateHeaders(limits, answer.usage), 'x-ebb-limit': limit };
    if (retryMs !== null) {
      headers['retry-after'] = String(Math.max(1, Math.ceil(retryMs / 1000)));
      headers['retry-after-ms'] = String(retryMs);
    }
    if (retryMs === null || budget) headers['x-should-retry'] = 'false';
    const when =
      answer.retryMs === null
        ? limit === 'concurrent_streams'
          ? 'retry once one of its streams has ended'
          : `the request asks for more than the whole limit: ask for fewer tokens (max_tokens)`
        : budget
          ? `the budget renews at ${new Date(Date.now() + answer.retryMs).toISOString()}`
          : `try again in ${resetText(answer.retryMs)}`;
    const message = budget
      ? `Tenant "${tenant}" has spent its token budget (${limit}): ${WORDS[limit]} ${value}, used ${used}, requested ${requested}; ${when}.`
      : `Rate limit reached for tenant "${tenant}" on ${WORDS[limit]} (${limit}): limit ${value}, used ${used}, requested ${requested}; ${when}.`;
    super(budget ? 'insufficient_quota' : 'rate_limit_exceeded', message, { headers });
  }

  override body(): ErrorBody {
    const b = super.body();
    b.error.limit = this.limit;
    // OpenAI types a tokens-per-minute 429 `tokens`, a requests one `requests`.
    if (this.limit === 'tokens_per_minute') b.error.type = 'tokens';
    return b;
  }
}
