/**
 * Tenant limits' counting cost on a request's way in and out (issue 48 item 1, "one round trip on
 * the hot path or an amortised lease of tokens per frontend: measure which"): a reservation and its
 * settle counted in this process (MemoryLimits: what a frontend's local share of an amortised lease
 * would cost per request, the lease's refills aside) against one atomic Lua step in Redis each way
 * (RedisLimits: what the frontend does), one after another (the latency a request pays) and 16 at a
 * time (throughput), on a redis-server the bench starts on this machine.
 *
 *   npx tsc -p . && node dist/bench/limits-store.js [--requests 5000]
 *
 * This is a benchmark, not a test: it prints a table and, last, one JSON line.
 */
import { cpuUsage } from 'node:process';
import { Redis } from 'ioredis';
import type { LimitStore } from '../src/frontend/limits/limit-store.js';
import { MemoryLimits } from '../src/frontend/limits/memory-limits.js';
import { RedisLimits } from '../src/frontend/limits/redis-limits.js';
import { startRedis } from '../test/helpers/redis.js';
import { percentile } from './percentile.js';

const i = process.argv.indexOf('--requests');
const REQUESTS = i < 0 ? 5000 : Number(process.argv[i + 1]);
const LIMITS = { requests_per_minute: 1e9, tokens_per_minute: 1e12, concurrent_streams: 1e6, tokens_per_day: 1e15, tokens_per_month: 1e15 };

interface Row {
  store: string;
  concurrency: number;
  p50_us: number;
  p99_us: number;
  per_s: number;
  cpu_us_per_request: number;
}

/** `REQUESTS` reservations and settles, `concurrency` at a time; each request's reserve-to-settle time. */
async function run(name: string, store: LimitStore, concurrency: number): Promise<Row> {
  const times: number[] = [];
  let next = 0;
  const tenant = `bench-${name}-${concurrency}-${Date.now()}`;
  const one = async () => {
    for (let n = next++; n < REQUESTS; n = next++) {
      const t0 = performance.now();
      const id = `r${n}`;
      const a = await store.reserve({ id, tenant, limits: LIMITS, tokens: 164, stream: true });
      if (!a.ok) throw new Error(`refused: ${a.limit}`);
      await store.settle({ id, tenant, reserved: 164, used: 80, periods: a.usage.periods });
      times.push((performance.now() - t0) * 1000);
    }
  };
  const cpu0 = cpuUsage();
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, one));
  const wall = performance.now() - t0;
  const cpu = cpuUsage(cpu0);
  return { store: name, concurrency, p50_us: percentile(times, 50), p99_us: percentile(times, 99), per_s: (REQUESTS / wall) * 1000, cpu_us_per_request: (cpu.user + cpu.system) / REQUESTS };
}

async function main(): Promise<void> {
  const redis = await startRedis();
  const client = new Redis(redis.url);
  try {
    const stores: Array<[string, LimitStore]> = [['memory', new MemoryLimits()], ['redis', new RedisLimits(client as never)]];
    // Warm-up: the Lua scripts loaded, the JIT warm.
    for (const [name, store] of stores) await run(`${name}-warm`, store, 4);
    const rows: Row[] = [];
    for (const c of [1, 16]) for (const [name, store] of stores) rows.push(await run(name, store, c));
    console.log(`${REQUESTS} reservations + settles per row (one tenant, every limit set, none reached), redis-server on this machine`);
    console.log('store    c   p50 us   p99 us   requests/s   this process CPU us/request');
    for (const r of rows) console.log(`${r.store.padEnd(7)}${String(r.concurrency).padStart(3)}${r.p50_us.toFixed(0).padStart(9)}${r.p99_us.toFixed(0).padStart(9)}${r.per_s.toFixed(0).padStart(13)}${r.cpu_us_per_request.toFixed(1).padStart(14)}`);
    console.log(JSON.stringify({ bench: 'limits-store', requests: REQUESTS, rows }));
  } finally {
    client.disconnect();
    await redis.stop();
  }
}

main().catch((err: unknown) => {
  console.error(`bench failed: ${(err as Error)?.stack ?? String(err)}`);
  process.exit(1);
});
