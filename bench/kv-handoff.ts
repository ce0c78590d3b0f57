/**
 * What moving KV saves (issue 25), with two llama-cpp engines in this process (a source and a
 * target, CPU, `--threads` each) on a generated llama model larger than the tests' tiny one:
 *
 * 1. Hand-off: the source generates `--delivered` tokens after a prompt of L tokens, then is handed
 *    off (the real path: kv_handoff exports the sequence). The target continues the stream to its
 *    first new token, either loading the exported state (received as a peer would: checked and
 *    hashed while read) or re-evaluating prompt + delivered tokens. Reported: ms of each, and
 *    re-prefill / KV.
 * 2. Disaggregated vs aggregated time to first token on long prompts: prefill on the source,
 *    state received and loaded by the target, first token there; against the target evaluating
 *    the prompt alone. On one machine both do the same arithmetic, so this is the transfer's
 *    overhead, not disaggregation's gain (that comes from prefill no longer sharing decode's GPU).
 *
 *   npx tsc -p . && node dist/bench/kv-handoff.js [--lengths 256,1024,2048,4096] [--delivered 32] [--rounds 3] [--threads 1]
 *
 * Medians over the rounds. Prints a table and, last, one JSON line.
 */
import { createReadStream } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { pino } from 'pino';
import type { GenerateRequest } from '../src/engine/engine.js';
import type { KvTransfer } from '../src/engine/kv-transfers.js';
import { loadLlamaCppEngine, type LlamaCppEngine } from '../src/engine/llama-cpp.js';
import { writeTinyLlamaGguf } from '../test/helpers/gguf.js';

interface Options {
  lengths: number[];
  delivered: number;
  rounds: number;
  threads: number;
}

function parse(argv: string[]): Options {
  const o: Options = { lengths: [256, 1024, 2048, 4096], delivered: 32, rounds: 3, threads: 1 };
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1] ?? ''];
    if (flag === '--lengths') o.lengths = value.split(',').map(Number);
    else if (flag === '--delivered') o.delivered = Number(value);
    else if (flag === '--rounds') o.rounds = Number(value);
    else if (flag === '--threads') o.threads = Number(value);
    else throw new Error(`unknown option ${flag}; options: --lengths --delivered --rounds --threads`);
  }
  if (![...o.lengths, o.delivered, o.rounds, o.threads].every((n) => Number.isInteger(n) && n >= 1)) throw new Error('every option wants integers >= 1');
  return o;
}

const CONTEXT = 8192;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;
const live = new AbortController().signal;

/** The hand-off's abort reason: the engine exports when `wanted` says so. */
class HandOff extends Error {}

/** A prompt of exactly `n` tokens of this model. */
function promptIds(engine: LlamaCppEngine, n: number): number[] {
  const words = 'the tide comes in over the harbor light and the river meets the sea at the quiet shore ';
  const ids = engine.render({ prompt: words.repeat(Math.ceil(n / 8) + 8) }).tokens as number[];
  if (ids.length < n) throw new Error('prompt too short');
  return ids.slice(0, n);
}

/** Receives a held state as a peer would (checked, hashed, written), for `target`. */
async function receive(source: LlamaCppEngine, target: LlamaCppEngine, t: KvTransfer) {
  const payload = source.kvPayload(t.transfer_id);
  if (!payload) throw new Error('no payload');
  const handle = await target.importKv(payload.header, payload.bytes, createReadStream(payload.path), live);
  source.kvTransfers.complete(t.transfer_id);
  return { handle, bytes: payload.bytes };
}

/** ms until the first token of `req` on `engine`, and that token's text. */
async function firstToken(engine: LlamaCppEngine, req: GenerateRequest): Promise<{ ms: number; text: string; cached: number }> {
  const start = performance.now();
  const g = engine.generate({ ...req, max_tokens: 1 }, live);
  let text = '';
  for (;;) {
    const step = await g.next();
    if (step.done) return { ms: performance.now() - start, text, cached: step.value.cached_tokens ?? 0 };
    text += step.value.text;
  }
}

/** The source runs `delivered` tokens, then is handed off: its exported state and the delivered continuation. */
async function handOff(source: LlamaCppEngine, ids: number[], delivered: number) {
  const abort = new AbortController();
  let exported: KvTransfer | undefined;
  const g = source.generate(
    {
      request_id: 'src',
      prompt: '',
      prompt_token_ids: ids,
      max_tokens: delivered + 64,
      temperature: 0,
      kv_handoff: { wanted: (r) => r instanceof HandOff, exported: (t) => (exported = t) },
    },
    abort.signal,
  );
  const tokenIds: number[] = [];
  let text = '';
  while (tokenIds.length < delivered) {
    const step = await g.next();
    if (step.done) throw new Error('the source ended before the hand-off');
    tokenIds.push(...(step.value.token_ids ?? []));
    text += step.value.text;
  }
  abort.abort(new HandOff());
  await g.return(undefined as never);
  if (!exported) throw new Error('the source exported nothing');
  return { transfer: exported, continuation: { text, completion_tokens: tokenIds.length, token_ids: tokenIds } };
}

async function main(): Promise<void> {
  const o = parse(process.argv.slice(2));
  // Larger than the tests' model, so that evaluating a prompt costs something measurable.
  const modelPath = writeTinyLlamaGguf({ embedding: 256, layers: 8, heads: 8, kvHeads: 4, feedForward: 1024, contextLength: CONTEXT });
  const log = pino({ level: 'warn' });
  const opts = { modelPath, parallel: 2, maxQueue: 4, contextSize: CONTEXT, threads: o.threads, gpu: 'off' as const };
  const source = await loadLlamaCppEngine(opts, log, live);
  const target = await loadLlamaCppEngine(opts, log, live);
  const rows: Array<Record<string, number>> = [];
  try {
    for (const length of o.lengths) {
      const ids = promptIds(target, length);
      const withKv: number[] = [];
      const refill: number[] = [];
      let stateBytes = 0;
      for (let r = 0; r < o.rounds; r++) {
        const { transfer, continuation } = await handOff(source, ids, o.delivered);
        const base: GenerateRequest = { request_id: 'dst', prompt: '', prompt_token_ids: ids, temperature: 0, continuation };
        const t0 = performance.now();
        const { handle, bytes } = await receive(source, target, transfer);
        const kv = await firstToken(target, { ...base, kv_state: handle });
        withKv.push(performance.now() - t0);
        stateBytes = bytes;
        const again = await firstToken(target, base);
        refill.push(again.ms);
        if (kv.text !== again.text) throw new Error(`L=${length}: the continuation with KV gave "${kv.text}", re-prefill "${again.text}"`);
        if (kv.cached !== length) throw new Error(`L=${length}: ${kv.cached} prompt tokens loaded, expected ${length}`);
      }
      const agg: number[] = [];
      const disagg: number[] = [];
      for (let r = 0; r < o.rounds; r++) {
        const req: GenerateRequest = { request_id: 'ttft', prompt: '', prompt_token_ids: ids, temperature: 0 };
        agg.push((await firstToken(target, req)).ms);
        const t0 = performance.now();
        const transfer = await source.prefill(req, live);
        const { handle } = await receive(source, target, transfer);
        await firstToken(target, { ...req, kv_state: handle });
        disagg.push(performance.now() - t0);
      }
      const row = {
        prompt_tokens: length,
        state_kib: Math.round(stateBytes / 1024),
        continue_kv_ms: median(withKv),
        continue_reprefill_ms: median(refill),
        reprefill_over_kv: median(refill) / median(withKv),
        ttft_aggregated_ms: median(agg),
        ttft_disaggregated_ms: median(disagg),
        disagg_over_agg: median(disagg) / median(agg),
      };
      rows.push(row);
      console.log(
        `L=${String(length).padStart(5)}  state ${String(row.state_kib).padStart(6)} KiB  continue: KV ${row.continue_kv_ms.toFixed(1)} ms, re-prefill ${row.continue_reprefill_ms.toFixed(1)} ms (x${row.reprefill_over_kv.toFixed(2)})  TTFT: aggregated ${row.ttft_aggregated_ms.toFixed(1)} ms, disaggregated ${row.ttft_disaggregated_ms.toFixed(1)} ms (x${row.disagg_over_agg.toFixed(2)})`,
      );
    }
  } finally {
    await source.close();
    await target.close();
  }
  console.log(JSON.stringify({ bench: 'kv-handoff', threads: o.threads, delivered: o.delivered, rounds: o.rounds, rows }));
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
