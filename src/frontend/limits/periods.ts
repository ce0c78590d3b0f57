/*
 * The windows limits are counted in, in milliseconds since the epoch (UTC): the minute that slides
 * with each request (requests and tokens per minute), and the calendar day and month a token budget
 * belongs to. The Redis store computes the same in Lua (limits-lua.ts), from Redis' own clock.
 */

/** The sliding window of requests_per_minute and tokens_per_minute. */
export const MINUTE_MS = 60_000;
export const DAY_MS = 86_400_000;

/** The UTC day `ms` falls in, as days since the epoch. */
export function dayOf(ms: number): number {
  return Math.floor(ms / DAY_MS);
}

/** The UTC month `ms` falls in, as months since year 0 (year * 12 + month - 1). */
export function monthOf(ms: number): number {
  const d = new Date(ms);
  return d.getUTCFullYear() * 12 + d.getUTCMonth();
}

/** When the UTC day after `day` starts. */
export function dayEnd(day: number): number {
  return (day + 1) * DAY_MS;
}

/** When the UTC month after `month` starts. */
export function monthEnd(month: number): number {
  const next = month + 1;
  return Date.UTC(Math.floor(next / 12), next % 12, 1);
}
