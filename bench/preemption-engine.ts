/**
 * What the spare sequence buys inside the llama-cpp engine (--preemption-spare-sequence, issue 48),
 * without the frontend, the worker and HTTP around it (bench/preemption.ts measures those too).
 *
 * Two engines in this process, the same tiny generated GGUF (one thread, CPU, --parallel 4,
 * --batch-invariant), one with a spare sequence and one without, taking turns: each round fills the
 * 4 slots with flex streams, queues a priority request, pauses one flex stream (its state handed
 * off, as the worker does), and times from the pause to the priority request's first token, and to
 * the paused stream's state being named.
 *
 *   npx tsc -p . && node dist/bench/preemption-engine.js [--rounds 30]
 *
 * This is a benchmark, not a test: it prints a table and, last, one JSON line.
 */
import { loadLlamaCppEngine, type LlamaCppEngine } from '../src/engine/llama-cpp.js';
import { PausedForContinuation, type GeneratedPiece, type GenerateRequest, type GenerateResult } from '../src/engine/engine.js';
import { createLogger } from '../src/common/logger.js';
import { writeTinyLlamaGguf } from '../test/helpers/gguf.js';
import { percentile } from './percentile.js';

const SLOTS = 4;
const i = process.argv.indexOf('--rounds');
const ROUNDS = i < 0 ? 30 : Number(process.argv[i + 1]);
if (!Number.isInteger(ROUNDS) || ROUNDS < 1) throw new Error('--rounds: expected a positive integer');

type Gen = AsyncGenerator<GeneratedPiece, GenerateResult, void>;

async function drain(g: Gen): Promise<void> {
  for (;;) if ((await g.next()).done) return;
}

/** One pause: ms from it to the priority request's first token, and to the paused stream's state named. */
async function round(engine: LlamaCppEngine, n: number): Promise<{ first: number; named: number }> {
  const live = new AbortController().signal;
  const controllers = Array.from({ length: SLOTS }, () => new AbortController());
  let named = NaN;
  let paused = 0;
  let transfer: string | undefined;
  const flex = controllers.map((c, s) =>
    engine.generate(
      {
        request_id: `flex${s}`,
        prompt: `question ${(n * SLOTS + s) % 8}: tell me about the tides and the moon`,
        max_tokens: 400,
        temperature: 0,
        tier: 'flex',
        kv_handoff: {
          wanted: (reason) => reason instanceof PausedForContinuation && reason.reason === 'preempted',
          exported: (t) => {
            named = performance.now() - paused;
            transfer = t.transfer_id;
          },
        },
      } satisfies GenerateRequest,
      c.signal,
    ),
  );
  // Every slot has streamed a few tokens.
  for (const f of flex) for (let k = 0; k < 3; k++) await f.next();
  const priority = engine.generate({ request_id: 'priority', prompt: `a priority question ${n}`, max_tokens: 4, temperature: 0, tier: 'priority' }, live);
  const first = priority.next();
  while (engine.stats().queued_sequences < 1) await new Promise((r) => setImmediate(r));
  paused = performance.now();
  controllers[0]!.abort(new PausedForContinuation('a priority request took its slot', 'preempted'));
  const cleanup = drain(flex[0]!).catch(() => undefined);
  await first;
  const firstMs = performance.now() - paused;
  await drain(priority);
  await cleanup;
  for (const c of controllers.slice(1)) c.abort(new Error('round over'));
  await Promise.all(flex.slice(1).map((f) => drain(f).catch(() => undefined)));
  if (transfer !== undefined) engine.kvTransfers.complete(transfer);
  return { first: firstMs, named };
}

async function main(): Promise<void> {
  const modelPath = writeTinyLlamaGguf();
  const log = createLogger('bench');
  log.level = 'warn';
  const live = new AbortController().signal;
  const base = { modelPath, parallel: SLOTS, maxQueue: 16, contextSize: 4096, threads: 1, gpu: 'off' as const, batchInvariant: true };
  const engines = { without: await loadLlamaCppEngine(base, log, live), spare: await loadLlamaCppEngine({ ...base, preemptionSpareSequence: true }, log, live) };
  const times = { without: { first: [] as number[], named: [] as number[] }, spare: { first: [] as number[], named: [] as number[] } };
  try {
    for (let n = 0; n < ROUNDS; n++) {
      // Taking turns, each first in every other round: the machine's load falls on both alike.
      const order = n % 2 === 0 ? (['without', 'spare'] as const) : (['spare', 'without'] as const);
      for (const k of order) {
        const r = await round(engines[k], n);
        times[k].first.push(r.first);
        times[k].named.push(r.named);
      }
    }
  } finally {
    await engines.without.close();
    await engines.spare.close();
  }
  const s = (xs: number[]) => ({ p50: percentile(xs, 50), p90: percentile(xs, 90), max: Math.max(...xs) });
  console.log(`llama-cpp in process (tiny generated GGUF, 1 thread, CPU, --parallel ${SLOTS}, --batch-invariant), ${ROUNDS} pauses each, taking turns; ms from the pause`);
  console.log('engine                      first token p50 / p90 / max     state named p50 / p90 / max');
  for (const k of ['without', 'spare'] as const) {
    const f = s(times[k].first);
    const m = s(times[k].named);
    console.log(`${(k === 'spare' ? '--preemption-spare-sequence' : 'no spare').padEnd(28)}${[f.p50, f.p90, f.max].map((x) => x.toFixed(1)).join(' / ').padStart(22)}    ${[m.p50, m.p90, m.max].map((x) => x.toFixed(1)).join(' / ').padStart(22)}`);
  }
  console.log(JSON.stringify({ bench: 'preemption-engine', rounds: ROUNDS, without: { first_token_ms: s(times.without.first), state_named_ms: s(times.without.named) }, spare: { first_token_ms: s(times.spare.first), state_named_ms: s(times.spare.named) } }));
}

main().catch((err: unknown) => {
  console.error(`bench failed: ${(err as Error)?.stack ?? String(err)}`);
  process.exit(1);
});
