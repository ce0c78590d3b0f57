/**
 * The admission queue (issue 35): what clients see when capacity shrinks or is oversubscribed, with
 * the frontend's queue off (`--queue-timeout 0`: today's behaviour, errors at once) and on, side by
 * side in one run, on the same mocker workers and the same load:
 *   (a) a rolling restart of model m1's 2 workers under open-loop load at `--load` (0.8) of the
 *       fleet's capacity: each worker in turn SIGTERMed (it drains and exits), then its replacement
 *       started (same --worker-id) and seen by the frontend. Client errors (goal with the queue:
 *       0), TTFT p50/p99.
 *   (b) model m2, served by one worker, restarted under load at `--single-load` (0.5) of its
 *       capacity, the replacement loading `--replacement-load-ms` (well inside the queue timeout):
 *       errors (goal with the queue: 0).
 *   (c) `flex` traffic at `--overload` (3x) the m1 fleet's capacity, 1 request in 5 `priority`
 *       (body `service_tier`): priority TTFT p99 against its unloaded value (goal <= 1.5x), flex
 *       sheds (429) and other errors.
 *   (d) tenant A (header x-ebb-tenant) at 10x tenant B's rate, together `--tenant-load` (1.5x)
 *       the capacity: B's completed requests per second against its fair share, min(B's rate,
 *       capacity / 2) (goal >= 90 %).
 * Rates are fractions of the capacity computed from the mocker's flags (`--mocker-batch-slots` per
 * worker, each request ttft + (tokens - 1) x itl long), the same in every run and column. Each
 * column first measures it (a closed loop of as many clients as m1 has batch slots, `--steady-ms`)
 * and warns when the machine delivers less than 80 % of it: a column's figures are then not
 * comparable. Each worker's own queue is bounded (`--mocker-max-queue`, as a real engine's is):
 * past it, the worker refuses (worker_overloaded).
 * Load is open-loop (evenly spaced arrivals, no client retries: every error is what a client would
 * have had to retry). Where the frontend has no --queue-timeout (the queue not built on this
 * branch), only the off column runs, and the output says so.
 *
 *   npm run build --silent && node dist/bench/admission.js [--cases a,b,c,d] [--slots 4] [--itl-ms 50] [--ttft-ms 50] [--tokens 6]
 *     [--max-queue 4] [--load 0.8] [--single-load 0.5] [--overload 3] [--tenant-load 1.5] [--steady-ms 3000] [--case-ms 10000]
 *     [--replacement-load-ms 2000] [--queue-timeout 30000] [--queue-depth N]
 *
 * Prints a table and, last, one JSON line. A watchdog bounds the run; children are killed on any exit.
 */
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { frontendSeesWorkers, metricValue, runEbb, startFrontend, startWorker, START_BOUND_MS, type FrontendHandle, type WorkerHandle } from '../test/helpers/processes.js';
import { arg } from './cli-arg.js';
import { guardedDiscovery } from './run-guard.js';
import { openLoop, summarize, timedCompletion, type Sample, type Summary } from './open-loop.js';

const o = {
  cases: arg('cases', 'a,b,c,d').split(','),
  slots: Number(arg('slots', '4')),
  itlMs: Number(arg('itl-ms', '50')),
  ttftMs: Number(arg('ttft-ms', '50')),
  tokens: Number(arg('tokens', '6')),
  maxQueue: Number(arg('max-queue', '4')),
  load: Number(arg('load', '0.8')),
  singleLoad: Number(arg('single-load', '0.5')),
  overload: Number(arg('overload', '3')),
  tenantLoad: Number(arg('tenant-load', '1.5')),
  steadyMs: Number(arg('steady-ms', '3000')),
  caseMs: Number(arg('case-ms', '10000')),
  replacementLoadMs: Number(arg('replacement-load-ms', '2000')),
  queueTimeout: Number(arg('queue-timeout', '30000')),
  queueDepth: arg('queue-depth', ''),
};

const discovery = guardedDiscovery('admission bench', 15 * 60_000);

const workerArgs = (model: string, id: string, loadMs = 0) => [
  '--discovery', discovery, '--model', model, '--worker-id', id,
  '--mocker-batch-slots', String(o.slots), '--mocker-itl-ms', String(o.itlMs), '--mocker-ttft-ms', String(o.ttftMs), '--mocker-max-queue', String(o.maxQueue),
  ...(loadMs > 0 ? ['--mocker-load-ms', String(loadMs)] : []),
];

/** The workers of the run, by model; a restart replaces its entry. */
const fleet: Record<'m1' | 'm2', WorkerHandle[]> = { m1: [], m2: [] };

/**
 * A restart as a StatefulSet does it: SIGTERM (the worker drains, then exits), then the replacement
 * with the same id, `loadMs` loading before it registers; done once the frontend routes to it.
 */
async function restart(frontend: FrontendHandle, model: 'm1' | 'm2', i: number, loadMs = 0): Promise<number> {
  const old = fleet[model][i] as WorkerHandle;
  const t0 = performance.now();
  const mark = frontend.mark();
  old.signal('SIGTERM');
  await old.exitCode(START_BOUND_MS);
  const next = await startWorker(workerArgs(model, old.workerId, loadMs));
  await frontend.waitForEvent('worker_added', (l) => l.worker_id === next.workerId, { after: mark, boundMs: START_BOUND_MS });
  fleet[model][i] = next;
  return performance.now() - t0;
}

const completion = (url: string, model: string, label: string, i: number, extra: Record<string, unknown> = {}, headers: Record<string, string> = {}) =>
  timedCompletion(url, label, { model, max_tokens: o.tokens, seed: i, ...extra }, headers);

/** m1's capacity in requests/s: as many closed-loop clients as the fleet has batch slots, for `--steady-ms`. */
async function measureCapacity(url: string): Promise<number> {
  const end = performance.now() + o.steadyMs;
  let ok = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: 2 * o.slots }, async (_, c) => {
      for (let i = 0; performance.now() < end; i++) if ((await completion(url, 'm1', 'capacity', c * 1000 + i)).ok) ok++;
    }),
  );
  return ok / ((performance.now() - t0) / 1000);
}

interface Column {
  a?: Summary & { restart_ms: number[] };
  b?: Summary & { restart_ms: number };
  c?: { priority_unloaded_ttft_p99_ms: number; priority: Summary; priority_p99_over_unloaded: number; flex: Summary; flex_shed_429: number; worker_refusals: number };
  d?: { a: Summary; b: Summary; b_rate: number; b_fair_share: number; b_throughput: number; b_fraction_of_fair_share: number };
}

async function caseA(url: string, frontend: FrontendHandle, capacity: number): Promise<NonNullable<Column['a']>> {
  const load = openLoop(o.load * capacity, (i) => completion(url, 'm1', 'm1', i));
  await sleep(o.steadyMs); // steady load before the first restart
  const restarts = [await restart(frontend, 'm1', 0), await restart(frontend, 'm1', 1)];
  await sleep(o.steadyMs);
  return { ...summarize(await load.stop()), restart_ms: restarts.map(Math.round) };
}

async function caseB(url: string, frontend: FrontendHandle, capacity: number): Promise<NonNullable<Column['b']>> {
  const load = openLoop((o.singleLoad * capacity) / 2, (i) => completion(url, 'm2', 'm2', i));
  await sleep(o.steadyMs);
  const restartMs = await restart(frontend, 'm2', 0, o.replacementLoadMs);
  await sleep(o.steadyMs);
  return { ...summarize(await load.stop()), restart_ms: Math.round(restartMs) };
}

async function caseC(url: string, capacity: number): Promise<NonNullable<Column['c']>> {
  // Unloaded: a few priority clients one request after another, well inside the fleet's slots.
  const unloaded: Sample[] = [];
  await Promise.all(Array.from({ length: 4 }, async (_, c) => {
    for (let i = 0; i < 8; i++) unloaded.push(await completion(url, 'm1', 'priority', c * 100 + i, { service_tier: 'priority' }));
  }));
  const base = summarize(unloaded);
  if (base.errors > 0) throw new Error(`unloaded priority requests failed: ${JSON.stringify(base.codes)}`);
  const tier = (i: number) => (i % 5 === 0 ? 'priority' : 'flex');
  // The workers' worker_overloaded refusals during the load: a frontend that retried flex on a full worker would show here.
  const refusals = () => Promise.all(fleet.m1.map((w) => metricValue(w.systemUrl, 'ebb_worker_admission_refusals_total', 'code="worker_overloaded"'))).then((n) => n.reduce((a, b) => a + b, 0));
  const refusedBefore = await refusals();
  const load = openLoop(o.overload * capacity, (i) => completion(url, 'm1', tier(i), i, { service_tier: tier(i) }));
  await sleep(o.caseMs);
  const samples = await load.stop();
  const workerRefusals = (await refusals()) - refusedBefore;
  const priority = summarize(samples.filter((s) => s.label === 'priority'));
  const flex = samples.filter((s) => s.label === 'flex');
  return {
    priority_unloaded_ttft_p99_ms: base.ttft_p99_ms,
    priority,
    priority_p99_over_unloaded: Math.round((priority.ttft_p99_ms / base.ttft_p99_ms) * 100) / 100,
    flex: summarize(flex),
    flex_shed_429: flex.filter((s) => s.status === 429).length,
    worker_refusals: workerRefusals,
  };
}

async function caseD(url: string, capacity: number): Promise<NonNullable<Column['d']>> {
  const bRate = (o.tenantLoad * capacity) / 11;
  const send = (tenant: string) => (i: number) => completion(url, 'm1', tenant, i, {}, { 'x-ebb-tenant': tenant });
  const t0 = performance.now();
  const loads = [openLoop(10 * bRate, send('A')), openLoop(bRate, send('B'))];
  await sleep(o.caseMs);
  const end = performance.now();
  const [a, b] = await Promise.all(loads.map((l) => l.stop()));
  // B's completions from a quarter into the window on, once queues have filled: its steady share.
  const from = t0 + (end - t0) / 4;
  const bDone = (b as Sample[]).filter((s) => s.ok && s.endedAt >= from && s.endedAt <= end).length;
  const throughput = bDone / ((end - from) / 1000);
  const fair = Math.min(bRate, capacity / 2);
  const round = (x: number) => Math.round(x * 100) / 100;
  return { a: summarize(a as Sample[]), b: summarize(b as Sample[]), b_rate: round(bRate), b_fair_share: round(fair), b_throughput: round(throughput), b_fraction_of_fair_share: round(throughput / fair) };
}

async function main(): Promise<void> {
  const help = await runEbb(['frontend', '--help'], {});
  const queueBuilt = help.stdout.includes('--queue-timeout');
  const columns: Array<[string, string[]]> = [['off', queueBuilt ? ['--queue-timeout', '0'] : []]];
  if (queueBuilt) columns.push(['on', ['--queue-timeout', String(o.queueTimeout), ...(o.queueDepth ? ['--queue-depth', o.queueDepth] : [])]]);
  else process.stdout.write('admission bench: this build\'s frontend has no --queue-timeout (the admission queue of issue 35 is not on this branch): the "off" column only\n');

  for (const id of ['a1', 'a2']) fleet.m1.push(await startWorker(workerArgs('m1', id))); // one at a time: a loaded machine starts them slowly
  fleet.m2.push(await startWorker(workerArgs('m2', 'b1')));
  const capacity = (2 * o.slots * 1000) / (o.ttftMs + (o.tokens - 1) * o.itlMs); // the first token comes at ttft, each next one itl later
  const measured: Record<string, number> = {};
  const results: Record<string, Column> = {};
  for (const [name, flags] of columns) {
    const frontend = await startFrontend(discovery, flags);
    try {
      await frontendSeesWorkers(frontend, 3);
      // A fresh frontend's first requests pay for its JIT: a few on each model before anything counts.
      for (let i = 0; i < 20; i++) await Promise.all(['m1', 'm2'].map((m) => completion(frontend.url, m, 'warm', i)));
      const got = (measured[name] = Math.round((await measureCapacity(frontend.url)) * 10) / 10);
      process.stdout.write(`queue ${name}: m1 capacity ${got} requests/s measured, ${capacity.toFixed(1)} computed (2 workers x ${o.slots} slots / (${o.ttftMs} + ${o.tokens - 1} x ${o.itlMs} ms))\n`);
      if (got < 0.8 * capacity) process.stdout.write(`WARNING: the machine delivers ${Math.round((100 * got) / capacity)} % of the computed capacity (other load): this column's figures are not comparable\n`);
      const col: Column = {};
      if (o.cases.includes('a')) col.a = await caseA(frontend.url, frontend, capacity);
      if (o.cases.includes('b')) col.b = await caseB(frontend.url, frontend, capacity);
      if (o.cases.includes('c')) col.c = await caseC(frontend.url, capacity);
      if (o.cases.includes('d')) col.d = await caseD(frontend.url, capacity);
      results[name] = col;
      process.stderr.write(`queue ${name}: done\n`);
    } finally {
      await frontend.stop();
    }
  }

  const names = Object.keys(results);
  const codes = (s: Summary | undefined) => (s === undefined ? '-' : s.errors === 0 ? '0' : `${s.errors} (${Object.entries(s.codes).map(([c, n]) => `${c} ${n}`).join(', ')})`);
  const rows: Array<[string, (c: Column) => string | number | undefined]> = [
    ['(a) rolling restart: requests', (c) => c.a?.requests],
    ['(a) client errors (goal 0)', (c) => codes(c.a)],
    ['(a) TTFT p50 / p99 ms', (c) => c.a && `${c.a.ttft_p50_ms} / ${c.a.ttft_p99_ms}`],
    ['(a) restart times ms', (c) => c.a?.restart_ms.join(', ')],
    ['(b) one-worker model: requests', (c) => c.b?.requests],
    ['(b) client errors (goal 0)', (c) => codes(c.b)],
    ['(b) TTFT p99 ms / restart ms', (c) => c.b && `${c.b.ttft_p99_ms} / ${c.b.restart_ms}`],
    ['(c) priority TTFT p99 unloaded ms', (c) => c.c?.priority_unloaded_ttft_p99_ms],
    ['(c) priority TTFT p99 at 3x ms', (c) => c.c?.priority.ttft_p99_ms],
    ['(c) ratio (goal <= 1.5)', (c) => c.c?.priority_p99_over_unloaded],
    ['(c) priority errors', (c) => codes(c.c?.priority)],
    ['(c) flex: requests / ok / shed 429', (c) => c.c && `${c.c.flex.requests} / ${c.c.flex.ok} / ${c.c.flex_shed_429}`],
    ['(c) flex errors', (c) => codes(c.c?.flex)],
    ['(c) workers\' overloaded refusals', (c) => c.c?.worker_refusals],
    ['(d) B req/s: offered / fair / got', (c) => c.d && `${c.d.b_rate} / ${c.d.b_fair_share} / ${c.d.b_throughput}`],
    ['(d) B share of fair (goal >= 0.9)', (c) => c.d?.b_fraction_of_fair_share],
    ['(d) errors A / B', (c) => c.d && `${codes(c.d.a)} / ${codes(c.d.b)}`],
  ];
  process.stdout.write(`2 + 1 mocker workers (${o.slots} slots, ttft ${o.ttftMs} ms, itl ${o.itlMs} ms, ${o.tokens} tokens, worker queue ${o.maxQueue}); m1 capacity ${capacity.toFixed(1)} req/s (measured: ${names.map((n) => `${n} ${measured[n]}`).join(', ')}); queue timeout ${o.queueTimeout} ms\n`);
  process.stdout.write(`${'case'.padEnd(36)}${names.map((n) => `queue ${n}`.padEnd(34)).join('')}\n`);
  for (const [label, get] of rows) {
    const cells = names.map((n) => String(get(results[n] as Column) ?? '-'));
    if (cells.every((c) => c === '-')) continue;
    process.stdout.write(`${label.padEnd(36)}${cells.map((c) => c.padEnd(34)).join('')}\n`);
  }
  process.stdout.write(JSON.stringify({ bench: 'admission', ...o, queue_built: queueBuilt, capacity_req_per_s: Math.round(capacity * 10) / 10, capacity_measured_req_per_s: measured, columns: results }) + '\n');
  await Promise.all([...fleet.m1, ...fleet.m2].map((w) => w.stop()));
}

main().catch((err: unknown) => {
  process.stderr.write(`admission bench: ${(err as Error).stack ?? String(err)}\n`);
  process.exitCode = 1;
});
