/**
 * Priority preemption benchmark (issue 48 item 3).
 *
 * One worker (4 batch slots, none kept back for priority) and one frontend. A priority
 * request's time to first token is measured on the idle fleet, then on a fleet whose every slot runs
 * flex streams (kept full in a closed loop), once with preemption (the default --preemption-limit 2)
 * and once with --preemption-limit 0 (a second frontend on the same worker): a priority request then
 * waits for a flex stream to end. Every flex stream is checked against its undisturbed text (the
 * mocker's text depends only on the prompt and the seed; llama-cpp's, at temperature 0 with
 * --batch-invariant, only on the prompt): byte-identical or lost. The worker is a mocker (TTFT 20
 * ms, 10 ms a token) or, with --engine llama-cpp, llama.cpp on a tiny generated GGUF model (one
 * thread, CPU; its paused streams' KV state goes with them); --spare-sequence gives that worker
 * --preemption-spare-sequence (a priority request starts on the spare while the paused stream writes
 * its state).
 *
 *   npx tsc -p . && node dist/bench/preemption.js [--engine mocker|llama-cpp] [--spare-sequence] [--priority 40] [--flex-tokens 150]
 *
 * A p99 of the default 40 requests is their slowest one; `--priority 500` gives a p99 that one
 * scheduling hiccup does not set (the phase without preemption then takes a few minutes).
 *
 * This is a benchmark, not a test: it prints a table and, last, one JSON line.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { frontendSeesWorkers, killAllNow, metricValue, startFrontend, startWorker, tempDiscoveryUrl, type FrontendHandle } from '../test/helpers/processes.js';
import { writeTinyLlamaGguf } from '../test/helpers/gguf.js';
import { streamCompletion } from '../test/helpers/sse.js';
import { percentile } from './percentile.js';

const SLOTS = 4;
const SEEDS = 8;

function flag(name: string, fallback: number): number {
  const i = process.argv.indexOf(name);
  const v = i < 0 ? fallback : Number(process.argv[i + 1]);
  if (!Number.isInteger(v) || v < 1) throw new Error(`${name}: expected a positive integer`);
  return v;
}

const PRIORITY = flag('--priority', 40);
const FLEX_TOKENS = flag('--flex-tokens', 150);
const ENGINE = process.argv.includes('--engine') ? process.argv[process.argv.indexOf('--engine') + 1] : 'mocker';
if (ENGINE !== 'mocker' && ENGINE !== 'llama-cpp') throw new Error('--engine: mocker or llama-cpp');
const MODEL = ENGINE === 'mocker' ? 'm1' : 'tiny';
const SPARE = process.argv.includes('--spare-sequence');
if (SPARE && ENGINE !== 'llama-cpp') throw new Error('--spare-sequence: llama-cpp only (--engine llama-cpp)');

/** The worker's engine: 4 slots, none kept back for priority. */
function engineArgs(): string[] {
  if (ENGINE === 'mocker') return ['--model', MODEL, '--mocker-batch-slots', String(SLOTS), '--mocker-itl-ms', '10', '--mocker-ttft-ms', '20'];
  return ['--engine', 'llama-cpp', '--model-path', writeTinyLlamaGguf(), '--model', MODEL, '--threads', '1', '--gpu', 'off', '--context-size', '4096', '--parallel', String(SLOTS), '--batch-invariant', ...(SPARE ? ['--preemption-spare-sequence'] : [])];
}
const ENGINE_LINE =
  ENGINE === 'mocker' ? 'mocker worker (ttft 20 ms, itl 10 ms)' : `llama-cpp worker (tiny generated GGUF, 1 thread, CPU, --batch-invariant${SPARE ? ', --preemption-spare-sequence' : ', no spare sequence'})`;

// Each seed its own question: llama.cpp at temperature 0 answers by the prompt alone.
const flexBody = (seed: number) => ({ model: MODEL, max_tokens: FLEX_TOKENS, seed, temperature: 0, service_tier: 'flex', messages: [{ role: 'user', content: `question ${seed}: tell me about the tides and the moon` }] });

/** TTFTs (ms) of `count` priority requests one after another, each a few tokens. */
async function priorityTtfts(f: FrontendHandle, count: number): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < count; i++) {
    const started = performance.now();
    let first = 0;
    const r = await streamCompletion(f.url, { model: MODEL, max_tokens: 4, seed: 1000 + i, temperature: 0, service_tier: 'priority', stream_options: { include_usage: true } }, () => (first = performance.now()));
    if (r.usage?.completion_tokens !== 4) throw new Error(`priority request ${i}: ${r.usage?.completion_tokens} tokens, ${r.error ?? `HTTP ${r.status}`}`);
    out.push(first - started);
    // A gap, as separate clients' requests have: the paused flex stream gets its slot back between them.
    await sleep(20);
  }
  return out;
}

interface FlexTally {
  completed: number;
  identical: number;
  lost: number;
}

/** Keeps every slot running flex streams until `stop`; each stream's text is checked against its reference. */
function fillWithFlex(f: FrontendHandle, reference: string[], stop: AbortSignal): { tally: FlexTally; running: Promise<void>; full: Promise<void> } {
  const tally: FlexTally = { completed: 0, identical: 0, lost: 0 };
  let started = 0;
  let markFull!: () => void;
  const full = new Promise<void>((resolve) => (markFull = resolve));
  const loop = async (slot: number) => {
    for (let round = 0; !stop.aborted; round++) {
      const seed = (slot + round * SLOTS) % SEEDS;
      const r = await streamCompletion(f.url, flexBody(seed), () => {
        if (++started === SLOTS) markFull();
      });
      tally.completed++;
      if (r.status === 200 && r.error === undefined && r.doneEvents === 1 && r.text === reference[seed]) tally.identical++;
      else tally.lost++;
    }
  };
  return { tally, running: Promise.all(Array.from({ length: SLOTS }, (_, s) => loop(s))).then(() => undefined), full };
}

const stats = (xs: number[]) => ({ p50: percentile(xs, 50), p99: percentile(xs, 99) });
const ms = (x: number) => x.toFixed(1);

async function main(): Promise<void> {
  const discovery = tempDiscoveryUrl();
  const worker = await startWorker(['--discovery', discovery, '--priority-reserve-slots', '0', ...engineArgs()]);
  const preempting = await startFrontend(discovery, ['--resume-grace-ms', '0']);
  const waiting = await startFrontend(discovery, ['--resume-grace-ms', '0', '--preemption-limit', '0']);
  await frontendSeesWorkers(preempting, 1);
  await frontendSeesWorkers(waiting, 1);
  try {
    // The undisturbed texts: flex alone, no priority request to pause them.
    const reference = await Promise.all(Array.from({ length: SEEDS }, async (_, seed) => (await streamCompletion(preempting.url, flexBody(seed))).text));
    const idle = await priorityTtfts(preempting, PRIORITY);
    const phase = async (f: FrontendHandle) => {
      const stop = new AbortController();
      const flex = fillWithFlex(f, reference, stop.signal);
      await flex.full;
      const ttfts = await priorityTtfts(f, PRIORITY);
      stop.abort();
      await flex.running;
      return { ttfts, tally: flex.tally };
    };
    const withPreemption = await phase(preempting);
    const without = await phase(waiting);
    const preemptions = await metricValue(worker.systemUrl, 'ebb_worker_preemptions_total');
    const rows = [
      ['idle fleet', stats(idle), undefined],
      ['full of flex, preemption (limit 2)', stats(withPreemption.ttfts), withPreemption.tally],
      ['full of flex, --preemption-limit 0', stats(without.ttfts), without.tally],
    ] as const;
    console.log(`1 ${ENGINE_LINE}, ${SLOTS} slots, no priority reserve; ${PRIORITY} priority requests of 4 tokens per phase; flex streams of ${FLEX_TOKENS} tokens keep every slot busy`);
    console.log('phase                                 ttft p50 ms  ttft p99 ms  p99 / idle  flex completed  identical  lost');
    for (const [name, s, t] of rows) console.log(`${name.padEnd(38)}${ms(s.p50).padStart(11)}  ${ms(s.p99).padStart(11)}  ${(s.p99 / stats(idle).p99).toFixed(2).padStart(10)}  ${String(t?.completed ?? '-').padStart(14)}  ${String(t?.identical ?? '-').padStart(9)}  ${String(t?.lost ?? '-').padStart(4)}`);
    console.log(`preemptions (the worker's ebb_worker_preemptions_total): ${preemptions}`);
    console.log(
      JSON.stringify({
        bench: 'preemption',
        engine: ENGINE,
        spare_sequence: SPARE,
        idle_ttft_ms: stats(idle),
        preempting: { ttft_ms: stats(withPreemption.ttfts), p99_vs_idle: stats(withPreemption.ttfts).p99 / stats(idle).p99, flex: withPreemption.tally },
        no_preemption: { ttft_ms: stats(without.ttfts), p99_vs_idle: stats(without.ttfts).p99 / stats(idle).p99, flex: without.tally },
        preemptions,
      }),
    );
    if (withPreemption.tally.lost + without.tally.lost > 0) process.exitCode = 1;
  } finally {
    await preempting.stop();
    await waiting.stop();
    await worker.stop();
    killAllNow();
  }
}

main().catch((err: unknown) => {
  console.error(`bench failed: ${(err as Error)?.stack ?? String(err)}`);
  killAllNow();
  process.exit(1);
});
