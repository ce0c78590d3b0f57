import { randomUUID } from 'node:crypto';
import type { Logger } from 'pino';
import { EbbError } from '../../protocol/errors.js';
import type { Usage } from '../../protocol/request-plane.js';
import type { StreamHold } from '../admission/ticket.js';
import type { Answer, Ask, LimitStore, Periods, TenantUsage } from './limit-store.js';
import type { LimitMetrics } from './limit-metrics.js';
import { STREAM_LEASE_MS } from './limits-lua.js';
import { MemoryLimits } from './memory-limits.js';
import { LimitRefusal, rateHeaders } from './rate-headers.js';
import { countsTokens, LIMIT_NAMES, limitsOf, type LimitName, type LimitsTable, type TenantLimits } from './tenant-limits.js';

/** `fmt`, its end's usage counted for `spend` (what the reservation settles to); `fmt` itself without one. */
export function counted<F extends { end(usage: Usage): string }>(fmt: F, spend: Spend | undefined): F {
  if (spend === undefined) return fmt;
  const end = fmt.end.bind(fmt);
  fmt.end = (usage: Usage) => {
    spend.used(usage.total_tokens);
    return end(usage);
  };
  return fmt;
}

/** What the frontend does while the shared store cannot be read: count in this frontend alone, or refuse (503). */
export type StoreDown = 'open' | 'closed';
export const STORE_DOWN_MODES: readonly StoreDown[] = ['open', 'closed'];

/** Tenants the listing names beyond the file's (those `*` covers, seen lately) at most. */
const MAX_SEEN = 1000;

/**
 * A request's reservation of its tenant's limits, from its admission to its answer's end:
 * - held: its tokens (and its request) counted; `stream`: it holds one of the tenant's concurrent streams;
 * - queued: it waits in the admission queue, its stream slot given back (queued requests do not count);
 * - taking: its turn came, its slot is being taken again;
 * - settled: its answer ended and its tokens were settled to what it used. Final.
 */
export type SpendState = { kind: 'held'; stream: boolean } | { kind: 'queued' } | { kind: 'taking'; taken: Promise<boolean> } | { kind: 'settled'; used: number };

/** One request's reservation: ONE state (SpendState), set by ONE setter, which only its limiter calls. */
export class Spend implements StreamHold {
  #state: SpendState;
  /** The tokens its answer counted (usage), once known. */
  usedTokens: number | undefined;

  constructor(
    private readonly owner: TenantLimiter,
    readonly ask: Ask,
    /** Where it was counted: the shared store, or this frontend's memory (no shared store, or failing open). */
    readonly store: LimitStore,
    readonly periods: Periods,
    /** OpenAI's x-ratelimit-* headers as they stood after it: on its answer. */
    readonly headers: Record<string, string>,
  ) {
    this.#state = { kind: 'held', stream: ask.stream };
  }

  get state(): SpendState {
    return this.#state;
  }

  /** The one setter; its limiter alone calls it. Settled is final. */
  set(next: SpendState): void {
    if (this.#state.kind !== 'settled') this.#state = next;
  }

  /** The answer's usage: what the reservation settles to. */
  used(tokens: number): void {
    this.usedTokens = (this.usedTokens ?? 0) + tokens;
  }

  queued(): void {
    this.owner.queued(this);
  }

  turn(): Promise<boolean> {
    return this.owner.turn(this);
  }

  /** Its answer is over (`status`: the client's answer's status; >= 400 without usage: nothing ran). */
  end(status: number): void {
    this.owner.settle(this, status);
  }
}

export interface TenantLimiterOptions {
  /** The limits in force (the file, followed; closed with the limiter). */
  limits: { readonly table: LimitsTable; close?(): void };
  /** The fleet's store (Redis) and whether it answers now; none: this frontend's memory. */
  shared?: { store: LimitStore; healthy(): boolean } | undefined;
  storeDown: StoreDown;
  log: Logger;
  metrics: LimitMetrics;
}

/** One tenant as `ebb tenants` and the dashboard show it. */
export interface TenantReport {
  tenant: string;
  /** Its limits, and whether they are its own or the file's `*`. */
  limits: TenantLimits;
  from: 'tenant' | '*';
  usage: { requests_last_minute: number; tokens_last_minute: number; concurrent_streams: number; tokens_today: number; tokens_this_month: number };
  remaining: Partial<Record<LimitName, number>>;
  /** Requests this frontend refused, by limit. */
  hits: Partial<Record<LimitName, number>>;
}

/**
 * Tenants' limits (--limits-file), taken before a request runs: each request reserves its tokens
 * (prompt estimate + max_tokens) and its share of every limit in one atomic step, in the fleet's
 * store (the --stream-store Redis) or, without one, in this process; the part it did not use is
 * refunded when its answer ends. The one owner of every Spend's state.
 */
export class TenantLimiter {
  private readonly local = new MemoryLimits();
  /** Spends holding a slot in the shared store, by tenant: renewed there while they run. */
  private readonly held = new Map<string, Set<Spend>>();
  private readonly renewer: NodeJS.Timeout;
  private storeUp = true;
  /** Tenants the file's `*` covers, seen lately (most recent last). */
  private readonly seen = new Map<string, number>();
  private readonly hits = new Map<string, Partial<Record<LimitName, number>>>();
  /** Each budgeted tenant's remaining tokens as last read: the gauge's source. */
  private readonly lastBudgets = new Map<string, { day?: number; month?: number }>();

  constructor(private readonly opts: TenantLimiterOptions) {
    this.renewer = setInterval(() => this.renew(), STREAM_LEASE_MS / 3).unref();
    opts.metrics.observe({ budgets: () => this.budgets() });
  }

  /** The limits `tenant` has now (undefined: none; nothing is counted for it). */
  limitsFor(tenant: string): TenantLimits | undefined {
    return limitsOf(this.opts.limits.table, tenant);
  }

  /**
   * Reserves `tokens` (0 when no token limit applies), one request and one concurrent stream of
   * `tenant`'s `limits` (a request that then waits in the queue gives its stream back until its
   * turn). Throws the 429 of the limit it would cross, or 503 limits_unavailable when the shared
   * store cannot be read and the frontend fails closed.
   */
  async reserve(tenant: string, limits: TenantLimits, tokens: number): Promise<Spend> {
    const ask: Ask = { id: randomUUID(), tenant, limits, tokens: countsTokens(limits) ? tokens : 0, stream: limits.concurrent_streams !== undefined };
    if (!this.opts.limits.table.tenants.has(tenant)) this.saw(tenant);
    const { store, answer } = await this.ask(ask);
    this.noteBudgets(tenant, limits, answer.usage);
    if (!answer.ok) {
      this.opts.metrics.limited(tenant, answer.limit);
      this.hit(tenant, answer.limit);
      throw new LimitRefusal(tenant, answer.limit, limits, answer, ask.tokens);
    }
    this.opts.metrics.admitted(tenant);
    const spend = new Spend(this, ask, store, answer.usage.periods, rateHeaders(limits, answer.usage));
    if (ask.stream) this.hold(spend);
    return spend;
  }

  /** The step in the shared store, or where it cannot be read, this frontend's memory (open) or a 503 (closed). */
  private async ask(ask: Ask): Promise<{ store: LimitStore; answer: Answer }> {
    const shared = this.opts.shared;
    if (shared === undefined) return { store: this.local, answer: this.local.reserveNow(ask) };
    if (shared.healthy()) {
      try {
        const answer = await shared.store.reserve(ask);
        this.up();
        return { store: shared.store, answer };
      } catch (err) {
        this.down(err);
      }
    } else this.down(undefined);
    const mode = this.opts.storeDown;
    this.opts.metrics.fallback(mode);
    if (mode === 'closed') {
      this.opts.metrics.unavailable(ask.tenant);
      throw new EbbError('limits_unavailable', `the fleet's limits store (Redis) cannot be reached and this frontend fails closed (--limits-store-down closed): tenant "${ask.tenant}"'s request is not admitted; retry shortly`, { headers: { 'retry-after': '1' } });
    }
    return { store: this.local, answer: this.local.reserveNow(ask) };
  }

  private down(err: unknown): void {
    if (!this.storeUp) return;
    this.storeUp = false;
    const open = this.opts.storeDown === 'open';
    this.opts.log.warn(
      { event: 'limits_store_unavailable', mode: this.opts.storeDown, ...(err === undefined ? {} : { err: (err as Error).message }) },
      open
        ? "the fleet's limits store (Redis) cannot be reached: limits are counted in this frontend alone until it is back (--limits-store-down open); each frontend admits up to each limit"
        : "the fleet's limits store (Redis) cannot be reached: requests of tenants with limits are refused (503 limits_unavailable) until it is back (--limits-store-down closed)",
    );
  }

  private up(): void {
    if (this.storeUp) return;
    this.storeUp = true;
    this.opts.log.info({ event: 'limits_store_available' }, "the fleet's limits store (Redis) answers again: limits are counted for the whole fleet");
  }

  queued(spend: Spend): void {
    const s = spend.state;
    if (s.kind !== 'held' || !s.stream) return;
    spend.set({ kind: 'queued' });
    this.unhold(spend);
    spend.store.releaseStream(spend.ask.tenant, spend.ask.id).catch(() => undefined);
  }

  turn(spend: Spend): Promise<boolean> {
    const s = spend.state;
    if (s.kind === 'taking') return s.taken;
    if (s.kind !== 'queued') return Promise.resolve(true);
    const taken = this.take(spend);
    spend.set({ kind: 'taking', taken });
    return taken;
  }

  /** A queued request's turn: its stream slot again (false: its tenant has none free; it stays queued). */
  private async take(spend: Spend): Promise<boolean> {
    const { tenant, id } = spend.ask;
    const limit = this.limitsFor(tenant)?.concurrent_streams;
    let got = true;
    let store = spend.store;
    if (limit !== undefined) {
      try {
        got = await store.takeStream(tenant, id, limit);
      } catch (err) {
        this.down(err);
        this.opts.metrics.fallback(this.opts.storeDown);
        if (this.opts.storeDown === 'closed') {
          spend.set({ kind: 'held', stream: false });
          throw new EbbError('limits_unavailable', `the fleet's limits store (Redis) cannot be reached and this frontend fails closed (--limits-store-down closed): tenant "${tenant}"'s queued request is not admitted; retry shortly`, { headers: { 'retry-after': '1' } });
        }
        store = this.local;
        got = await store.takeStream(tenant, id, limit);
      }
    }
    if (spend.state.kind === 'settled') {
      if (got && limit !== undefined) store.releaseStream(tenant, id).catch(() => undefined);
      return got;
    }
    if (!got) {
      spend.set({ kind: 'queued' });
      return false;
    }
    spend.set({ kind: 'held', stream: limit !== undefined });
    if (limit !== undefined) this.hold(spend);
    return true;
  }

  /**
   * The answer ended: the reservation settles to the tokens it used (its usage; none counted: 0
   * when it failed before it ran, `status` >= 400, else all it reserved), its slot freed.
   */
  settle(spend: Spend, status: number): void {
    if (spend.state.kind === 'settled') return;
    const used = spend.usedTokens ?? (status >= 400 ? 0 : spend.ask.tokens);
    spend.set({ kind: 'settled', used });
    this.unhold(spend);
    if (used > 0) this.opts.metrics.used(spend.ask.tenant, used);
    const { id, tenant, tokens } = spend.ask;
    // A slot its turn took here while the shared store was down (failing open) is here.
    if (spend.store !== this.local) void this.local.releaseStream(tenant, id);
    spend.store.settle({ id, tenant, reserved: tokens, used, periods: spend.periods }).catch((err: unknown) =>
      this.opts.log.warn({ event: 'limits_settle_failed', tenant, reserved: tokens, used, err: (err as Error).message }, `could not settle tenant "${tenant}"'s reservation in the limits store (${(err as Error).message}): it stays counted as reserved`),
    );
  }

  private hold(spend: Spend): void {
    if (spend.store === this.local) return;
    let set = this.held.get(spend.ask.tenant);
    if (set === undefined) this.held.set(spend.ask.tenant, (set = new Set()));
    set.add(spend);
  }

  private unhold(spend: Spend): void {
    const set = this.held.get(spend.ask.tenant);
    if (set?.delete(spend) && set.size === 0) this.held.delete(spend.ask.tenant);
  }

  /** The shared store's slots this frontend holds lapse unless renewed (a dead frontend's free themselves). */
  private renew(): void {
    const store = this.opts.shared?.store;
    if (store === undefined || this.held.size === 0) return;
    const ids = new Map([...this.held].map(([tenant, spends]) => [tenant, [...spends].map((s) => s.ask.id)]));
    store.renewStreams(ids).catch(() => undefined);
  }

  /** A refusal this frontend answered, for the listing (bounded: a header can name any tenant). */
  private hit(tenant: string, limit: LimitName): void {
    const h = this.hits.get(tenant);
    if (h === undefined && this.hits.size >= MAX_SEEN) return;
    const counts = h ?? {};
    counts[limit] = (counts[limit] ?? 0) + 1;
    this.hits.set(tenant, counts);
  }

  private saw(tenant: string): void {
    this.seen.delete(tenant);
    this.seen.set(tenant, Date.now());
    if (this.seen.size > MAX_SEEN) this.seen.delete(this.seen.keys().next().value!);
  }

  private noteBudgets(tenant: string, limits: TenantLimits, usage: TenantUsage): void {
    if (limits.tokens_per_day === undefined && limits.tokens_per_month === undefined) return;
    this.lastBudgets.delete(tenant);
    this.lastBudgets.set(tenant, {
      ...(limits.tokens_per_day !== undefined && { day: Math.max(0, limits.tokens_per_day - usage.day) }),
      ...(limits.tokens_per_month !== undefined && { month: Math.max(0, limits.tokens_per_month - usage.month) }),
    });
    if (this.lastBudgets.size > MAX_SEEN) this.lastBudgets.delete(this.lastBudgets.keys().next().value!);
  }

  private *budgets(): Generator<[string, 'day' | 'month', number]> {
    for (const [tenant, b] of this.lastBudgets) {
      if (b.day !== undefined) yield [tenant, 'day', b.day];
      if (b.month !== undefined) yield [tenant, 'month', b.month];
    }
  }

  /** Every tenant the file names (and those its `*` covered lately): limits, use now, what remains, this frontend's refusals. */
  async report(): Promise<{ store: 'redis' | 'memory'; store_up: boolean; store_down: StoreDown; tenants: TenantReport[] }> {
    const table = this.opts.limits.table;
    const shared = this.opts.shared;
    const useShared = shared !== undefined && shared.healthy();
    const store = useShared ? shared.store : this.local;
    const names: Array<[string, TenantLimits, 'tenant' | '*']> = [...table.tenants].map(([t, l]) => [t, l, 'tenant']);
    if (table.any !== undefined) for (const t of this.seen.keys()) if (!table.tenants.has(t)) names.push([t, table.any, '*']);
    const tenants = await Promise.all(
      names.slice(0, MAX_SEEN).map(async ([tenant, limits, from]): Promise<TenantReport> => {
        const u = await store.usage(tenant).catch(() => this.local.usage(tenant));
        const counted: Record<LimitName, number> = { requests_per_minute: u.requests, tokens_per_minute: u.tokens, concurrent_streams: u.streams, tokens_per_day: u.day, tokens_per_month: u.month };
        const remaining: Partial<Record<LimitName, number>> = {};
        for (const name of LIMIT_NAMES) if (limits[name] !== undefined) remaining[name] = Math.max(0, limits[name] - counted[name]);
        return {
          tenant,
          limits,
          from,
          usage: { requests_last_minute: u.requests, tokens_last_minute: u.tokens, concurrent_streams: u.streams, tokens_today: u.day, tokens_this_month: u.month },
          remaining,
          hits: this.hits.get(tenant) ?? {},
        };
      }),
    );
    return { store: shared === undefined ? 'memory' : 'redis', store_up: shared === undefined || useShared, store_down: this.opts.storeDown, tenants: tenants.sort((a, b) => a.tenant.localeCompare(b.tenant)) };
  }

  close(): void {
    clearInterval(this.renewer);
    this.opts.limits.close?.();
  }
}
