import type { LimitName, TenantLimits } from './tenant-limits.js';

/** One request's ask of its tenant's limits, checked and taken in one atomic step. */
export interface Ask {
  /** The reservation's id: what its settle and its stream slot are found by. */
  id: string;
  tenant: string;
  limits: TenantLimits;
  /** Tokens reserved: the prompt's estimate plus the tokens it may generate (0 where no token limit applies). */
  tokens: number;
  /** Take one of the tenant's concurrent streams now (its request goes to a worker at once). */
  stream: boolean;
}

/** The calendar day and month a reservation's tokens were counted in (periods.ts): its settle adjusts those. */
export interface Periods {
  day: number;
  month: number;
}

/** A tenant's counts: in the sliding minute, its streams now, its budgets' use in the current day and month. */
export interface TenantUsage {
  requests: number;
  tokens: number;
  streams: number;
  day: number;
  month: number;
  /** ms until the minute's window is empty again (its newest entry leaves); 0 when it is. */
  resetMs: number;
  periods: Periods;
}

/**
 * What a reservation got: taken (the counts after it), or refused by `limit`, with when to ask
 * again (`retryMs`; null when waiting cannot help: the request asks for more than the limit, or a
 * stream slot frees when another request ends, which nothing forecasts).
 */
export type Answer = ({ ok: true } | { ok: false; limit: LimitName; retryMs: number | null }) & { usage: TenantUsage };

/** A reservation's end: what it used in fact, for its tokens' refund (or the overrun charged). */
export interface Settle {
  id: string;
  tenant: string;
  reserved: number;
  used: number;
  periods: Periods;
}

/**
 * Where tenants' counts live: this process's memory (exact for one frontend) or the fleet's Redis
 * (exact for every frontend that shares it). Each step is atomic: two frontends asking at once
 * never both take the last token.
 */
export interface LimitStore {
  readonly kind: 'memory' | 'redis';
  reserve(ask: Ask): Promise<Answer>;
  /** The request ended: its tokens settled to what it used, its stream slot (if it holds one) freed. */
  settle(s: Settle): Promise<void>;
  /** A stream slot for a request whose turn came (it waited in the queue without one); false when the tenant is at its limit. */
  takeStream(tenant: string, id: string, limit: number): Promise<boolean>;
  /** A request that goes to wait in the queue gives its stream slot back (queued requests do not count). */
  releaseStream(tenant: string, id: string): Promise<void>;
  /** The slots this frontend holds are still held (the Redis store's slots lapse unless renewed, so a dead frontend's free themselves). */
  renewStreams(held: ReadonlyMap<string, readonly string[]>): Promise<void>;
  usage(tenant: string): Promise<TenantUsage>;
}
