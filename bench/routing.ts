/**
 * Routing cost per decision with a large registered fleet, in process: pick + acquire + release,
 * the work a request does in the pool, with the fleet under a steady mix of in-flight counts.
 *
 *   node dist/bench/routing.js [--workers 10000] [--decisions 200000] [--pool dist/src/frontend/worker-pool.js]
 *
 * `--pool` lets the same loop time another build of the pool (say, a checkout from before a change).
 */
import { pathToFileURL } from 'node:url';
import { resolve } from 'node:path';
import type { WorkerPool as Pool } from '../src/frontend/routing/worker-pool.js';

function flag(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? (process.argv[i + 1] as string) : dflt;
}

export async function routingCost(workers: number, decisions: number, poolModule?: string): Promise<{ workers: number; ns_per_decision: number }> {
  const mod = (poolModule ? await import(pathToFileURL(resolve(poolModule)).href) : await import('../src/frontend/routing/worker-pool.js')) as { WorkerPool: new () => Pool };
  const pool = new mod.WorkerPool();
  pool.apply({
    type: 'reset',
    records: Array.from({ length: workers }, (_, i) => ({ worker_id: `w-${i}`, model: i % 10 === 0 ? 'other' : 'm', mode: 'aggregated' as const, request_url: `http://10.0.${i >> 8}.${i & 255}:9000`, system_url: `http://10.0.${i >> 8}.${i & 255}:9001` })),
  });
  // A steady state: as many open requests as workers, released in the order they were opened.
  const open: (() => void)[] = [];
  const tried = new Set<string>();
  const step = () => {
    tried.clear();
    const w = pool.pick('m', 'aggregated', tried);
    if (!w) throw new Error('no worker');
    tried.add(w.record.worker_id);
    open.push(pool.acquire(w));
    if (open.length > workers) (open.shift() as () => void)();
  };
  for (let i = 0; i < Math.min(decisions, 20_000); i++) step(); // warm-up
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < decisions; i++) step();
  const ns = Number(process.hrtime.bigint() - t0) / decisions;
  return { workers, ns_per_decision: Math.round(ns) };
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const counts = flag('workers', '100,1000,10000').split(',').map(Number);
  const decisions = Number(flag('decisions', '200000'));
  const poolModule = process.argv.includes('--pool') ? flag('pool', '') : undefined;
  const rows = [];
  for (const n of counts) rows.push(await routingCost(n, n >= 10_000 && poolModule ? Math.min(decisions, 20_000) : decisions, poolModule));
  for (const r of rows) console.log(`${String(r.workers).padStart(6)} workers: ${(r.ns_per_decision / 1000).toFixed(3)} µs per routing decision (pick + acquire + release)`);
  console.log(JSON.stringify({ bench: 'routing', rows }));
}
