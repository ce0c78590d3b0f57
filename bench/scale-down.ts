/**
 * Which workers a scale-down takes, and what it costs (issue 24): ebb's choice (the victim ranking:
 * least work to wait for, least cache, youngest) vs. a random choice vs. the youngest workers (what
 * a ReplicaSet does by default).
 *
 * Starts 8 mocker workers and a frontend on loopback. Each trial opens
 * `--streams` streams of mixed lengths (seeded, `--min`..`--max` tokens, long-tailed) through the
 * frontend, one after the other, lets them run `--settle-ms`, then takes `--count` victims by each strategy in turn
 * (the same load replayed for each), drains them and measures:
 *   - without a deadline: the time from the drain calls until every victim is drained, i.e. deletable
 *     with nothing lost (the streams they carried finish on them);
 *   - with `--deadline-ms` (a grace period, as Kubernetes gives a pod): how many streams were still
 *     running on the victims at the deadline and were handed off to the workers that stay, or cut
 *     (a stream that did not complete whole; none is expected).
 * ebb's victims come from the ranking `ebb scale-down` and the frontend's POST
 * /models/{model}/scale-down use (victim-ranking), on the workers' own status; every strategy's
 * victims are drained the same way (POST /engine/drain).
 * Victims are resumed and every stream finished before the next measurement.
 *
 *   npx tsc -p . && node dist/bench/scale-down.js [--trials 3] [--streams 32] [--min 20] [--max 600] [--itl-ms 10] [--count 4] [--settle-ms 500] [--deadline-ms 1000]
 *
 * Prints a table and, last, one JSON line. A watchdog bounds the run; children are killed on any exit.
 */
import { performance } from 'node:perf_hooks';
import { call } from '../test/helpers/http.js';
import { killAllNow, startFrontend, startWorker, tempDiscoveryUrl, type FrontendHandle, type WorkerHandle } from '../test/helpers/processes.js';
import { streamCompletion, type StreamOutcome } from '../test/helpers/sse.js';
import { chooseVictims, isChoiceProblem } from '../src/frontend/admin/victim-ranking.js';
// The mocker's seeded generator (mulberry32): every strategy sees the same load, every run the same trials.
import { prng } from '../src/engine/mocker.js';

interface Options {
  trials: number;
  streams: number;
  min: number;
  max: number;
  itlMs: number;
  count: number;
  settleMs: number;
  deadlineMs: number;
}

const STRATEGIES = ['ebb', 'random', 'youngest'] as const;
type Strategy = (typeof STRATEGIES)[number];

function parse(argv: string[]): Options {
  const o: Options = { trials: 3, streams: 32, min: 20, max: 600, itlMs: 10, count: 4, settleMs: 500, deadlineMs: 1000 };
  const keys: Record<string, keyof Options> = { '--trials': 'trials', '--streams': 'streams', '--min': 'min', '--max': 'max', '--itl-ms': 'itlMs', '--count': 'count', '--settle-ms': 'settleMs', '--deadline-ms': 'deadlineMs' };
  for (let i = 0; i < argv.length; i += 2) {
    const key = keys[argv[i] ?? ''];
    const n = Number(argv[i + 1]);
    if (key === undefined) throw new Error(`unknown option ${argv[i]}; options: ${Object.keys(keys).join(' ')}`);
    if (!Number.isInteger(n) || n < 0) throw new Error(`${argv[i]} wants an integer >= 0, got "${argv[i + 1]}"`);
    o[key] = n;
  }
  if (o.count < 1 || o.count >= 8) throw new Error('--count: 1..7 (of 8 workers)');
  return o;
}

/** Long-tailed lengths: most streams short, a few long (log-uniform between min and max). */
function lengths(o: Options, seed: number): number[] {
  const r = prng(seed);
  return Array.from({ length: o.streams }, () => Math.round(Math.exp(Math.log(o.min) + r() * (Math.log(o.max) - Math.log(o.min)))));
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

interface Point {
  deletableMs: number;
  handedOff: number;
  cut: number;
}

async function choose(strategy: Strategy, workers: WorkerHandle[], o: Options, r: () => number): Promise<WorkerHandle[]> {
  if (strategy === 'youngest') return workers.slice(-o.count);
  if (strategy === 'random') {
    const pool = workers.slice();
    for (let i = pool.length - 1; i > 0; i--) {
      const j = Math.floor(r() * (i + 1));
      [pool[i], pool[j]] = [pool[j] as WorkerHandle, pool[i] as WorkerHandle];
    }
    return pool.slice(0, o.count);
  }
  // The ranking `ebb scale-down` and POST /models/{model}/scale-down use, on every worker's status
  // read here without the frontend's 1 s bound (a loaded machine can be slower to answer).
  const candidates = await Promise.all(workers.map(async (w) => ({ worker_id: w.workerId, mode: 'aggregated' as const, status: (await call('GET', `${w.systemUrl}/engine/status`)).body })));
  const choice = chooseVictims('m1', candidates, o.count);
  if (isChoiceProblem(choice)) throw new Error(choice.message);
  const ids = choice.victims.map((v) => v.worker_id);
  if (process.env.BENCH_VERBOSE) process.stderr.write(`ranking: ${choice.ranking.map((v) => `${v.worker_id}=${v.eta_if_drained_ms}/${v.inflight_requests}`).join(' ')}\n`);
  return ids.map((id) => workers.find((w) => w.workerId === id) as WorkerHandle);
}

/** One measurement: the load, the victims of `strategy`, their drains; then everything put back. */
async function measure(frontend: FrontendHandle, workers: WorkerHandle[], o: Options, strategy: Strategy, load: number[], deadline: boolean, r: () => number): Promise<Point> {
  // Opened one at a time, each once its first token came: the frontend's least-in-flight routing
  // then deals them out alike in every measurement (which worker gets which share may rotate).
  const streams: Promise<StreamOutcome>[] = [];
  for (const [seed, max_tokens] of load.entries()) {
    let first!: () => void;
    const started = new Promise<void>((resolve) => (first = resolve));
    const s = streamCompletion(frontend.url, { model: 'm1', max_tokens, seed }, () => first());
    streams.push(s);
    await Promise.race([started, s]);
  }
  await sleep(o.settleMs);
  const victims = await choose(strategy, workers, o, r);
  const marks = victims.map((w) => w.mark());
  const t0 = performance.now();
  await Promise.all(
    victims.map(async (w) => {
      const d = await call('POST', `${w.systemUrl}/engine/drain`, { reason: `bench ${strategy}`, persist: false, ...(deadline ? { deadline_ms: o.deadlineMs } : {}) });
      if (d.status !== 200 && d.status !== 202) throw new Error(`drain of ${w.workerId} answered ${d.status}: ${JSON.stringify(d.body)}`);
    }),
  );
  await Promise.all(victims.map((w, i) => w.waitForEvent('state_changed', (l) => l.to === 'drained', { after: marks[i] })));
  const deletableMs = performance.now() - t0;
  const handedOff = (await Promise.all(victims.map(async (w) => (await call('GET', `${w.systemUrl}/engine/status`)).body.handed_off as number))).reduce((a, b) => a + b, 0);
  const outcomes = await Promise.all(streams);
  const cut = outcomes.filter((x, i) => x.status !== 200 || !x.done || x.tokens !== load[i] || x.error).length;
  for (const w of victims) {
    const mark = frontend.mark();
    await call('POST', `${w.systemUrl}/engine/resume`);
    await frontend.waitForEvent('worker_added', (l) => l.worker_id === w.workerId, { after: mark });
  }
  return { deletableMs, handedOff, cut };
}

const median = (xs: number[]): number => {
  const s = xs.slice().sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
};

async function main(): Promise<void> {
  const o = parse(process.argv.slice(2));
  const watchdog = setTimeout(() => {
    process.stderr.write('scale-down bench: watchdog fired, stopping\n');
    killAllNow();
    process.exit(3);
  }, 120_000 + o.trials * STRATEGIES.length * 2 * (o.max * o.itlMs * 2 + o.settleMs + 5000));
  watchdog.unref();
  process.on('exit', killAllNow);
  const discovery = tempDiscoveryUrl();
  const args = ['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', String(o.itlMs), '--mocker-batch-slots', '64'];
  const workers: WorkerHandle[] = [];
  // One after the other: their start order is their age, the youngest last.
  for (let i = 0; i < 8; i++) workers.push(await startWorker([...args, '--worker-id', `w${i + 1}`]));
  const frontend = await startFrontend(discovery);
  for (const w of workers)
    await frontend.waitForLog((l) => (l.event === 'worker_added' && l.worker_id === w.workerId) || (l.event === 'discovery_reset' && (l.workers as string[]).includes(w.workerId)), `frontend sees ${w.workerId}`);
  // Warm every worker once: the drain ETA needs an observed per-token time.
  await Promise.all(Array.from({ length: 16 }, (_, seed) => streamCompletion(frontend.url, { model: 'm1', max_tokens: 5, seed })));

  const results: Record<Strategy, Point[]> = { ebb: [], random: [], youngest: [] };
  const withDeadline: Record<Strategy, Point[]> = { ebb: [], random: [], youngest: [] };
  for (let t = 0; t < o.trials; t++) {
    const load = lengths(o, 1000 + t);
    for (const s of STRATEGIES) {
      results[s].push(await measure(frontend, workers, o, s, load, false, prng(7 + t)));
      withDeadline[s].push(await measure(frontend, workers, o, s, load, true, prng(7 + t)));
      const a = results[s][t] as Point;
      const b = withDeadline[s][t] as Point;
      process.stderr.write(`trial ${t + 1} ${s}: deletable in ${Math.round(a.deletableMs)} ms (cut ${a.cut}); deadline ${o.deadlineMs} ms: ${b.handedOff} handed off, ${b.cut} cut\n`);
    }
  }
  const rows = STRATEGIES.map((s) => ({
    strategy: s,
    deletable_ms: results[s].map((p) => Math.round(p.deletableMs)),
    deletable_median_ms: Math.round(median(results[s].map((p) => p.deletableMs))),
    handed_off: withDeadline[s].map((p) => p.handedOff),
    handed_off_total: withDeadline[s].reduce((a, p) => a + p.handedOff, 0),
    cut_total: [...results[s], ...withDeadline[s]].reduce((a, p) => a + p.cut, 0),
  }));
  const ebb = rows[0] as (typeof rows)[number];
  process.stdout.write(`8 workers, ${o.streams} streams of ${o.min}..${o.max} tokens, ITL ${o.itlMs} ms, scale down by ${o.count}, ${o.trials} trial(s), deadline ${o.deadlineMs} ms\n`);
  process.stdout.write('strategy   deletable (ms, per trial)        median  vs ebb   handed off at deadline  vs ebb   cut\n');
  for (const r of rows)
    process.stdout.write(
      `${r.strategy.padEnd(9)}  ${r.deletable_ms.join(', ').padEnd(30)}  ${String(r.deletable_median_ms).padStart(6)}  ${(r.deletable_median_ms / Math.max(1, ebb.deletable_median_ms)).toFixed(2).padStart(5)}x  ${`${r.handed_off.join(', ')} (${r.handed_off_total})`.padEnd(22)}  ${(r.handed_off_total / Math.max(1, ebb.handed_off_total)).toFixed(2).padStart(5)}x  ${r.cut_total}\n`,
    );
  process.stdout.write(JSON.stringify({ bench: 'scale-down', ...o, rows }) + '\n');
  await Promise.all([frontend, ...workers].map((p) => p.stop()));
}

main().catch((err: unknown) => {
  process.stderr.write(`scale-down bench: ${(err as Error).stack ?? String(err)}\n`);
  killAllNow();
  process.exit(1);
});
