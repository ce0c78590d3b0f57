import type { RedisClient } from '../streams/redis-store.js';
import type { Answer, Ask, LimitStore, Settle, TenantUsage } from './limit-store.js';
import { limitKeys, RENEW, RESERVE, SETTLE, STREAM_LEASE_MS, TAKE_STREAM, USAGE } from './limits-lua.js';
import type { LimitName } from './tenant-limits.js';

/** The commands the Lua steps are defined as on the store's client. */
interface LimitCommands {
  ebbLimitReserve(...args: Array<string | number>): Promise<number[]>;
  ebbLimitSettle(...args: Array<string | number>): Promise<number>;
  ebbLimitTake(...args: Array<string | number>): Promise<number>;
  ebbLimitRenew(...args: Array<string | number>): Promise<number>;
  ebbLimitUsage(...args: Array<string | number>): Promise<number[]>;
}

/** RESERVE's refused-limit index (1-5) as its Lua numbers them. */
const BY_INDEX: readonly LimitName[] = ['requests_per_minute', 'tokens_per_minute', 'concurrent_streams', 'tokens_per_day', 'tokens_per_month'];

/** RESERVE's and USAGE's counts, from `at` in its answer. */
function usageAt(a: number[], at: number): TenantUsage {
  return { requests: a[at]!, tokens: a[at + 1]!, streams: a[at + 2]!, day: a[at + 3]!, month: a[at + 4]!, resetMs: a[at + 5]!, periods: { day: a[at + 6]!, month: a[at + 7]! } };
}

/**
 * The limits counted in the fleet's Redis (the one --stream-store names): exact across every
 * frontend that shares it, one round trip per request on its way in (RESERVE) and one at its end
 * (SETTLE). Its commands fail at once while Redis is unreachable (the store's client has no offline
 * queue): the limiter then fails open or closed, as configured.
 */
export class RedisLimits implements LimitStore {
  readonly kind = 'redis';
  private readonly r: RedisClient & LimitCommands;

  constructor(client: RedisClient) {
    const define = (name: string, keys: number, lua: string) => client.defineCommand(name, { numberOfKeys: keys, lua });
    define('ebbLimitReserve', 4, RESERVE);
    define('ebbLimitSettle', 4, SETTLE);
    define('ebbLimitTake', 1, TAKE_STREAM);
    define('ebbLimitRenew', 1, RENEW);
    define('ebbLimitUsage', 4, USAGE);
    this.r = client as RedisClient & LimitCommands;
  }

  async reserve(ask: Ask): Promise<Answer> {
    const l = ask.limits;
    const n = (v: number | undefined) => v ?? -1;
    const a = await this.r.ebbLimitReserve(...limitKeys(ask.tenant), ask.id, ask.tokens, n(l.requests_per_minute), n(l.tokens_per_minute), n(l.tokens_per_day), n(l.tokens_per_month), n(l.concurrent_streams), ask.stream ? 1 : 0, STREAM_LEASE_MS);
    const usage = usageAt(a, 3);
    if (a[0] === 1) return { ok: true, usage };
    return { ok: false, limit: BY_INDEX[a[1]! - 1]!, retryMs: a[2]! < 0 ? null : a[2]!, usage };
  }

  async settle(s: Settle): Promise<void> {
    await this.r.ebbLimitSettle(...limitKeys(s.tenant), s.id, s.reserved, s.used, s.periods.day, s.periods.month);
  }

  async takeStream(tenant: string, id: string, limit: number): Promise<boolean> {
    return (await this.r.ebbLimitTake(limitKeys(tenant)[2], id, limit, STREAM_LEASE_MS)) === 1;
  }

  async releaseStream(tenant: string, id: string): Promise<void> {
    await this.r.zrem(limitKeys(tenant)[2], id);
  }

  async renewStreams(held: ReadonlyMap<string, readonly string[]>): Promise<void> {
    await Promise.all([...held].map(([tenant, ids]) => this.r.ebbLimitRenew(limitKeys(tenant)[2], STREAM_LEASE_MS, ...ids)));
  }

  async usage(tenant: string): Promise<TenantUsage> {
    return usageAt(await this.r.ebbLimitUsage(...limitKeys(tenant)), 0);
  }
}
