/**
 * LoRA adapters (issue 37): adapter-aware routing (`--router kv`) against least-loaded, side by side
 * in one run, on the same 4 mocker workers, each with every one of `--adapters` (16) adapters
 * available and `--lora-slots` (2) resident at once, loading one taking `--lora-load-ms`.
 * Open-loop load at `--rate` requests/s, each naming an adapter as its `model`, picked by Zipf
 * popularity (exponent `--zipf`, the same seeded sequence for both routers). Each router gets
 * `--warm-s` of this unreported (its JIT, the adapters' residency settling), then `--seconds`
 * measured. Reported per router: TTFT p50/p99 (to the first content token), errors, adapter loads
 * per minute (the workers' ebb_worker_adapter_loads_total over the measured window), and how many
 * distinct adapters each worker served (least-loaded spreads every adapter over every worker).
 * Goals with adapter-aware routing: loads >= 5x fewer, TTFT p50 <= 0.5x.
 *
 *   npm run build --silent && node dist/bench/lora.js [--workers 4] [--adapters 16] [--lora-slots 2] [--lora-load-ms 500] [--zipf 1]
 *     [--rate 20] [--seconds 20] [--warm-s 4] [--tokens 6] [--itl-ms 20] [--ttft-ms 20] [--batch-slots 8] [--base-model-only]
 *
 * Where the workers have no --mocker-lora (adapters not built on this branch) it stops, saying so;
 * `--base-model-only` then runs the same harness with every request for the base model (the
 * adapter only a label; no loads to count), to check the harness itself.
 * Prints a table and, last, one JSON line. A watchdog bounds the run; children are killed on any exit.
 */
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { prng } from '../src/engine/mocker.js';
import { frontendSeesWorkers, metricSum, runEbb, startFrontend, startWorker, type WorkerHandle } from '../test/helpers/processes.js';
import { arg } from './cli-arg.js';
import { guardedDiscovery } from './run-guard.js';
import { openLoop, summarize, timedCompletion, zipf, type Sample, type Summary } from './open-loop.js';

const o = {
  workers: Number(arg('workers', '4')),
  adapters: Number(arg('adapters', '16')),
  loraSlots: Number(arg('lora-slots', '2')),
  loraLoadMs: Number(arg('lora-load-ms', '500')),
  zipf: Number(arg('zipf', '1')),
  rate: Number(arg('rate', '20')),
  seconds: Number(arg('seconds', '20')),
  warmS: Number(arg('warm-s', '4')),
  tokens: Number(arg('tokens', '6')),
  itlMs: Number(arg('itl-ms', '20')),
  ttftMs: Number(arg('ttft-ms', '20')),
  batchSlots: Number(arg('batch-slots', '8')),
  baseModelOnly: process.argv.includes('--base-model-only'),
};
const BASE = 'base';
const ROUTERS = ['kv', 'least-loaded'] as const;
const adapterNames = Array.from({ length: o.adapters }, (_, i) => `lora-${String(i).padStart(2, '0')}`);

const discovery = guardedDiscovery('lora bench', 120_000 + 4 * (o.warmS + o.seconds) * 1000);

interface Row extends Summary {
  router: string;
  adapter_loads: number | null;
  adapter_loads_per_min: number | null;
  /** Distinct adapters each worker served, averaged over the workers. */
  adapters_per_worker: number;
}

const loadsNow = async (workers: WorkerHandle[]) => (await Promise.all(workers.map((w) => metricSum(w.systemUrl, 'ebb_worker_adapter_loads_total')))).reduce((a, b) => a + b, 0);

async function run(router: string, workers: WorkerHandle[]): Promise<Row> {
  const frontend = await startFrontend(discovery, ['--router', router]);
  try {
    await frontendSeesWorkers(frontend, o.workers);
    if (router === 'kv') for (const w of workers) await frontend.waitForEvent('kv_stream_connected', (l) => l.worker_id === w.workerId);
    // A fresh seeded picker per phase: every router sees the same sequence of adapters.
    const sender = (seed: number) => {
      const pick = zipf(o.adapters, o.zipf, prng(seed));
      return (i: number): Promise<Sample> => {
        const adapter = adapterNames[pick()] as string;
        return timedCompletion(frontend.url, adapter, { model: o.baseModelOnly ? BASE : adapter, max_tokens: o.tokens, seed: i });
      };
    };
    const warm = openLoop(o.rate, sender(7));
    await sleep(o.warmS * 1000);
    await warm.stop();
    const loads0 = o.baseModelOnly ? 0 : await loadsNow(workers);
    const t0 = performance.now();
    const load = openLoop(o.rate, sender(42));
    await sleep(o.seconds * 1000);
    const samples = await load.stop();
    const minutes = (performance.now() - t0) / 60_000;
    const loads = o.baseModelOnly ? null : (await loadsNow(workers)) - loads0;
    const served = new Map<string, Set<string>>();
    for (const s of samples) if (s.ok && s.workerId) served.set(s.workerId, (served.get(s.workerId) ?? new Set()).add(s.label));
    return {
      router,
      ...summarize(samples),
      adapter_loads: loads,
      adapter_loads_per_min: loads === null ? null : Math.round(loads / minutes),
      adapters_per_worker: Math.round(([...served.values()].reduce((a, s) => a + s.size, 0) / Math.max(1, served.size)) * 10) / 10,
    };
  } finally {
    await frontend.stop();
  }
}

async function main(): Promise<void> {
  const help = await runEbb(['worker', '--help'], {});
  const built = help.stdout.includes('--mocker-lora');
  if (!built && !o.baseModelOnly) {
    process.stderr.write('lora bench: this build\'s workers have no --mocker-lora: LoRA adapters (issue 37) are not on this branch. `--base-model-only` runs the harness against the base model.\n');
    process.exit(2);
  }
  const adapterArgs = o.baseModelOnly ? [] : [...adapterNames.flatMap((a) => ['--mocker-lora', a]), '--mocker-lora-slots', String(o.loraSlots), '--mocker-lora-load-ms', String(o.loraLoadMs)];
  const args = ['--discovery', discovery, '--model', BASE, '--mocker-batch-slots', String(o.batchSlots), '--mocker-itl-ms', String(o.itlMs), '--mocker-ttft-ms', String(o.ttftMs), ...adapterArgs];
  const workers: WorkerHandle[] = [];
  for (let i = 0; i < o.workers; i++) workers.push(await startWorker(args)); // one at a time: a loaded machine starts them slowly
  const rows: Row[] = [];
  for (const router of ROUTERS) rows.push(await run(router, workers));

  const pick = zipf(o.adapters, o.zipf, prng(42));
  const top = Array.from({ length: 10_000 }, pick).filter((i) => i === 0).length / 100;
  process.stdout.write(
    `${o.workers} mocker workers, ${o.adapters} adapters (Zipf ${o.zipf}: the top one ${top} % of requests), ${o.loraSlots} resident per worker, load ${o.loraLoadMs} ms; ${o.rate} req/s of ${o.tokens} tokens, ${o.seconds} s per router${o.baseModelOnly ? '; BASE MODEL ONLY (harness check: adapters are labels, nothing loads)' : ''}\n`,
  );
  process.stdout.write('router        requests  errors  TTFT p50  TTFT p99  adapter loads  loads/min  adapters per worker\n');
  for (const r of rows)
    process.stdout.write(
      `${r.router.padEnd(13)} ${String(r.requests).padStart(8)}  ${String(r.errors).padStart(6)}  ${`${r.ttft_p50_ms} ms`.padStart(8)}  ${`${r.ttft_p99_ms} ms`.padStart(8)}  ${String(r.adapter_loads ?? '-').padStart(13)}  ${String(r.adapter_loads_per_min ?? '-').padStart(9)}  ${String(r.adapters_per_worker).padStart(19)}\n`,
    );
  const [kv, ll] = rows as [Row, Row];
  const round = (x: number) => Math.round(x * 100) / 100;
  const ttftRatio = round(kv.ttft_p50_ms / ll.ttft_p50_ms);
  const loadsRatio = kv.adapter_loads === null || ll.adapter_loads === null ? null : round(ll.adapter_loads / Math.max(1, kv.adapter_loads));
  if (!o.baseModelOnly && rows.every((r) => r.adapter_loads === 0)) process.stderr.write('lora bench: no worker counted an adapter load (ebb_worker_adapter_loads_total): the loads column is not measured\n');
  process.stdout.write(`kv TTFT p50 / least-loaded: ${ttftRatio} (goal <= 0.5); least-loaded loads / kv: ${loadsRatio ?? '-'} (goal >= 5)\n`);
  process.stdout.write(JSON.stringify({ bench: 'lora', ...o, lora_built: built, rows, kv_over_least_loaded_ttft_p50: ttftRatio, least_loaded_over_kv_loads: loadsRatio }) + '\n');
  await Promise.all(workers.map((w) => w.stop()));
}

main().catch((err: unknown) => {
  process.stderr.write(`lora bench: ${(err as Error).stack ?? String(err)}\n`);
  process.exitCode = 1;
});
