/**
 * Drain ETA: predicted vs actual drain time over a few load shapes (issue 14).
 *
 * For each shape it starts a mocker worker on loopback, warms it up (the estimate needs an observed
 * per-token time), opens the shape's streams straight at the worker's request plane, waits until
 * they have generated for a while, drains, and compares the `eta_ms` of the drain's answer with the
 * time from that answer to the worker's `drained` status event (its status stream, no polling). It
 * also reads the prediction again halfway (GET /engine/status) to show how the estimate holds
 * as the drain proceeds. Every stream must complete whole (the run fails otherwise). Shapes:
 *   uniform     16 streams of 150 tokens, started together
 *   mixed       16 streams of 20..400 tokens, staggered
 *   queued      16 streams of 80 tokens on 4 batch slots (12 wait in the engine's queue)
 *   unbounded   8 streams without max_tokens on a 300-token context (the context bounds them)
 *
 *   npx tsc -p . && node dist/bench/drain-eta.js [--itl-ms 10] [--runs 3]
 *
 * Prints a table and, last, one JSON line. Kills its children on any exit.
 */
import { openEventStream } from '../test/helpers/event-stream.js';
import { call, openLineStream, type OpenStream } from '../test/helpers/http.js';
import { killAllNow, startWorker, tempDiscoveryUrl } from '../test/helpers/processes.js';

interface Shape {
  name: string;
  /** Budgets of the streams (undefined: no max_tokens). */
  budgets: Array<number | undefined>;
  /** ms between stream starts. */
  staggerMs: number;
  workerArgs: string[];
}

function parse(argv: string[]): { itlMs: number; runs: number } {
  const o = { itlMs: 10, runs: 3 };
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], Number(argv[i + 1])];
    if (!Number.isInteger(value) || value < 1) throw new Error(`${flag} wants a positive integer`);
    if (flag === '--itl-ms') o.itlMs = value;
    else if (flag === '--runs') o.runs = value;
    else throw new Error(`unknown option ${flag}; options: --itl-ms --runs`);
  }
  return o;
}

const SHAPES: Shape[] = [
  { name: 'uniform', budgets: Array(16).fill(150), staggerMs: 0, workerArgs: [] },
  { name: 'mixed', budgets: Array.from({ length: 16 }, (_, i) => 20 + Math.round((380 * ((i * 7) % 16)) / 15)), staggerMs: 15, workerArgs: [] },
  { name: 'queued', budgets: Array(16).fill(80), staggerMs: 0, workerArgs: ['--mocker-batch-slots', '4'] },
  { name: 'unbounded', budgets: Array(8).fill(undefined), staggerMs: 0, workerArgs: ['--mocker-max-context', '300'] },
];

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Point {
  shape: string;
  predicted_ms: number | null;
  actual_ms: number;
  error_pct: number | null;
  halfway_predicted_ms: number | null;
  halfway_actual_ms: number;
  halfway_error_pct: number | null;
}

async function runShape(shape: Shape, itlMs: number): Promise<Point> {
  const w = await startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'm1', '--mocker-itl-ms', String(itlMs), ...shape.workerArgs]);
  try {
    await (await openLineStream(`${w.requestUrl}/generate`, { model: 'm1', prompt: 'warm up', max_tokens: 10, stream: true })).done;
    const streams: OpenStream[] = [];
    for (const [i, budget] of shape.budgets.entries()) {
      streams.push(await openLineStream(`${w.requestUrl}/generate`, { model: 'm1', prompt: `stream ${i}`, seed: i, stream: true, ...(budget === undefined ? {} : { max_tokens: budget }) }));
      if (shape.staggerMs > 0) await sleep(shape.staggerMs);
    }
    await Promise.all(streams.map((s) => s.first));
    // Let the streams run a while, so the drain starts mid-generation rather than at their start.
    await sleep(20 * itlMs);
    const events = await openEventStream(`${w.systemUrl}/engine/status/events`);
    const drain = await call('POST', `${w.systemUrl}/engine/drain`, { reason: 'bench' });
    const t0 = performance.now();
    const predicted = drain.body.eta_ms as number | null;
    const after = events.events.length;
    // Halfway (by the prediction), the estimate is read again: a timer, because the point is a time.
    const halfway = sleep((predicted ?? 0) / 2).then(async () => {
      const at = performance.now() - t0;
      const st = await call('GET', `${w.systemUrl}/engine/status`);
      return { eta: st.body.state === 'draining' ? (st.body.eta_ms as number | null) : null, at };
    });
    await events.waitFor((e) => e.event === 'status' && e.data.state === 'drained', 'drained', after);
    const actual = performance.now() - t0;
    events.close();
    const half = await halfway;
    const lines = await Promise.all(streams.map((s) => s.done));
    const broken = lines.filter((l) => !/"done":true/.test(l.at(-1) ?? ''));
    if (broken.length > 0) throw new Error(`${shape.name}: ${broken.length} stream(s) did not complete`);
    const err = (p: number | null, a: number) => (p === null || a <= 0 ? null : (100 * (p - a)) / a);
    const halfActual = actual - half.at;
    return {
      shape: shape.name,
      predicted_ms: predicted,
      actual_ms: Math.round(actual),
      error_pct: err(predicted, actual),
      halfway_predicted_ms: half.eta,
      halfway_actual_ms: Math.round(halfActual),
      halfway_error_pct: err(half.eta, halfActual),
    };
  } finally {
    await w.stop();
  }
}

async function main(): Promise<void> {
  const { itlMs, runs } = parse(process.argv.slice(2));
  const points: Point[] = [];
  for (const shape of SHAPES) for (let r = 0; r < runs; r++) points.push(await runShape(shape, itlMs));
  const fmt = (v: number | null, d = 0) => (v === null ? 'null' : v.toFixed(d));
  console.log(`drain ETA, mocker --mocker-itl-ms ${itlMs}, ${runs} run(s) per shape`);
  console.log('shape      predicted  actual  error%   halfway: predicted  actual  error%');
  for (const p of points)
    console.log(
      `${p.shape.padEnd(10)} ${fmt(p.predicted_ms).padStart(9)} ${fmt(p.actual_ms).padStart(7)} ${fmt(p.error_pct, 1).padStart(7)}   ${fmt(p.halfway_predicted_ms).padStart(18)} ${fmt(p.halfway_actual_ms).padStart(7)} ${fmt(p.halfway_error_pct, 1).padStart(7)}`,
    );
  const errs = points.map((p) => p.error_pct).filter((e): e is number => e !== null).map(Math.abs);
  const summary = { bench: 'drain-eta', itl_ms: itlMs, runs, max_abs_error_pct: Math.max(...errs), mean_abs_error_pct: errs.reduce((a, b) => a + b, 0) / errs.length, points };
  console.log(`max |error| ${summary.max_abs_error_pct.toFixed(1)}%, mean |error| ${summary.mean_abs_error_pct.toFixed(1)}%`);
  console.log(JSON.stringify(summary));
}

process.on('exit', killAllNow);
main().then(
  () => process.exit(0),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
