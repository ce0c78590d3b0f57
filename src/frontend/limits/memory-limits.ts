import type { Answer, Ask, LimitStore, Periods, Settle, TenantUsage } from './limit-store.js';
import { dayEnd, dayOf, MINUTE_MS, monthEnd, monthOf } from './periods.js';
import type { LimitName } from './tenant-limits.js';

interface Entry {
  readonly id: string;
  readonly at: number;
  tokens: number;
}

/** Tenants remembered at most: past it the one idle longest is forgotten (its windows empty by then, or it is one of thousands). */
const MAX_TENANTS = 100_000;

/** One tenant's counts: the minute's requests in arrival order (each with its tokens), its streams, its budgets' use by period. */
class Counts {
  private log: Entry[] = [];
  private head = 0;
  private readonly byId = new Map<string, Entry>();
  tokens = 0;
  readonly streams = new Set<string>();
  /** Budget use by period: `d<day>` and `m<month>`, the current and the one before (a late settle adjusts it). */
  readonly budget = new Map<string, number>();

  get requests(): number {
    return this.log.length - this.head;
  }

  /** Drops the entries the minute has passed (an entry at t counts until t + 1 min). */
  purge(now: number): void {
    const log = this.log;
    while (this.head < log.length && log[this.head]!.at <= now - MINUTE_MS) {
      const e = log[this.head++]!;
      this.tokens -= e.tokens;
      this.byId.delete(e.id);
    }
    if (this.head > 1024 && this.head * 2 > log.length) {
      this.log = log.slice(this.head);
      this.head = 0;
    }
  }

  add(id: string, at: number, tokens: number): void {
    const e = { id, at, tokens };
    this.log.push(e);
    this.byId.set(id, e);
    this.tokens += tokens;
  }

  /** `id`'s tokens are `used` now, if it is still in the minute (else it already left it). */
  adjust(id: string, used: number): void {
    const e = this.byId.get(id);
    if (e === undefined) return;
    this.tokens += used - e.tokens;
    e.tokens = used;
  }

  /** When the `k`-th oldest entry (from 0) leaves the minute. */
  leaves(k: number): number {
    return this.log[this.head + k]!.at + MINUTE_MS;
  }

  /** When enough of the minute's tokens have left it for `need` more to fit under `limit`. */
  tokensFree(need: number, limit: number): number {
    let left = this.tokens;
    for (let i = this.head; i < this.log.length; i++) {
      left -= this.log[i]!.tokens;
      if (left + need <= limit) return this.log[i]!.at + MINUTE_MS;
    }
    return this.log[this.log.length - 1]!.at + MINUTE_MS;
  }

  /** When the minute is empty again. */
  emptyAt(now: number): number {
    return this.requests === 0 ? now : this.log[this.log.length - 1]!.at + MINUTE_MS;
  }

  used(key: string): number {
    return this.budget.get(key) ?? 0;
  }

  charge(periods: Periods, tokens: number): void {
    for (const key of [`d${periods.day}`, `m${periods.month}`]) this.budget.set(key, this.used(key) + tokens);
    // The period before stays for a late settle; older ones go.
    this.budget.delete(`d${periods.day - 2}`);
    this.budget.delete(`m${periods.month - 2}`);
  }

  /** A settle's difference, in the periods its reservation was counted in (where they are still kept). */
  refund(periods: Periods, delta: number): void {
    for (const key of [`d${periods.day}`, `m${periods.month}`]) {
      const n = this.budget.get(key);
      if (n !== undefined) this.budget.set(key, n + delta);
    }
  }
}

/**
 * The limits counted in this process's memory: exact for one frontend (one process). Every step is
 * synchronous, so atomic. Pure but for its clock, which a test may give.
 */
export class MemoryLimits implements LimitStore {
  readonly kind = 'memory';
  private readonly tenants = new Map<string, Counts>();

  constructor(private readonly now: () => number = Date.now) {}

  private counts(tenant: string, now: number): Counts {
    let c = this.tenants.get(tenant);
    if (c === undefined) {
      c = new Counts();
      if (this.tenants.size >= MAX_TENANTS) this.tenants.delete(this.tenants.keys().next().value!);
    } else this.tenants.delete(tenant);
    // Most recently used last: the first is the one idle longest.
    this.tenants.set(tenant, c);
    c.purge(now);
    return c;
  }

  private usageOf(c: Counts, now: number): TenantUsage {
    const periods = { day: dayOf(now), month: monthOf(now) };
    return { requests: c.requests, tokens: c.tokens, streams: c.streams.size, day: c.used(`d${periods.day}`), month: c.used(`m${periods.month}`), resetMs: c.emptyAt(now) - now, periods };
  }

  reserve(ask: Ask): Promise<Answer> {
    return Promise.resolve(this.reserveNow(ask));
  }

  /** The synchronous step (the limiter's fail-open path calls it too). */
  reserveNow(ask: Ask): Answer {
    const now = this.now();
    const c = this.counts(ask.tenant, now);
    const usage = this.usageOf(c, now);
    const refused = (limit: LimitName, at: number | null): Answer => ({ ok: false, limit, retryMs: at === null ? null : Math.max(1, at - now), usage });
    const l = ask.limits;
    const rpm = l.requests_per_minute;
    if (rpm !== undefined && c.requests + 1 > rpm) return refused('requests_per_minute', rpm === 0 ? null : c.leaves(c.requests - rpm));
    const tpm = l.tokens_per_minute;
    if (tpm !== undefined && c.tokens + ask.tokens > tpm) return refused('tokens_per_minute', ask.tokens > tpm ? null : c.tokensFree(ask.tokens, tpm));
    const perDay = l.tokens_per_day;
    if (perDay !== undefined && usage.day + ask.tokens > perDay) return refused('tokens_per_day', ask.tokens > perDay ? null : dayEnd(usage.periods.day));
    const perMonth = l.tokens_per_month;
    if (perMonth !== undefined && usage.month + ask.tokens > perMonth) return refused('tokens_per_month', ask.tokens > perMonth ? null : monthEnd(usage.periods.month));
    const streams = l.concurrent_streams;
    if (ask.stream && streams !== undefined && c.streams.size >= streams) return refused('concurrent_streams', null);
    c.add(ask.id, now, ask.tokens);
    c.charge(usage.periods, ask.tokens);
    if (ask.stream && streams !== undefined) c.streams.add(ask.id);
    return { ok: true, usage: this.usageOf(c, now) };
  }

  settle(s: Settle): Promise<void> {
    const c = this.counts(s.tenant, this.now());
    c.adjust(s.id, s.used);
    c.refund(s.periods, s.used - s.reserved);
    c.streams.delete(s.id);
    return Promise.resolve();
  }

  takeStream(tenant: string, id: string, limit: number): Promise<boolean> {
    const c = this.counts(tenant, this.now());
    if (c.streams.has(id)) return Promise.resolve(true);
    if (c.streams.size >= limit) return Promise.resolve(false);
    c.streams.add(id);
    return Promise.resolve(true);
  }

  releaseStream(tenant: string, id: string): Promise<void> {
    this.tenants.get(tenant)?.streams.delete(id);
    return Promise.resolve();
  }

  renewStreams(): Promise<void> {
    return Promise.resolve();
  }

  usage(tenant: string): Promise<TenantUsage> {
    const now = this.now();
    const c = this.tenants.get(tenant);
    if (c === undefined) return Promise.resolve(this.usageOf(new Counts(), now));
    c.purge(now);
    return Promise.resolve(this.usageOf(c, now));
  }
}
