/**
 * Cache affinity across several frontends (issue 47): the kv router's full prefix hits on a
 * multi-turn workload whose turns land on different frontends, with 1, 3 and 8 frontends over the
 * same mocker workers, in one run.
 *
 * The workload is bench/kv-routing.ts's: `--clients` loops each hold one conversation at a time (one
 * of 3 shared system prompts, the conversation's own document, then `--turns` turns, each appending
 * the question and the answer, 0.2-0.6 s apart), on workers whose caches hold a few conversations
 * (`--kv-blocks`, cache pressure). Turn t of conversation c goes to frontend (c + t) mod F: no two
 * turns in a row reach the same frontend (F > 1). A later turn is a *full hit* when the worker it
 * reached had cached every whole block of the previous turn's prompt (cached_tokens >= that
 * prompt's whole blocks): the router sent it where the conversation lives, and the conversation was
 * still there. The first turn of a conversation cannot hit (its document is new) and is not counted.
 *
 * Each frontend count gets fresh frontends (default flags: kv router, one process each) and prompts
 * of its own; its clients arrive over the first second and converse without a break: the first 5 s
 * are not reported (a fresh frontend's JIT; no burst of new conversations at the clock's start),
 * then turns sent in the next `--seconds` are. Reported per count: full-hit
 * share of the later turns, the workers' hit rate (cached / prompt tokens over all turns), TTFT
 * p50/p99, errors.
 *
 *   npm run build && node dist/bench/kv-affinity.js [--frontends 1,3,8] [--workers 4] [--clients 16] [--seconds 20] [--turns 5] [--doc-words 2500] [--kv-blocks 1024]
 *     [--ebb-cli <another build's dist/bin/ebb.js>]   (the frontends from that build; the workers from this one)
 *
 * Prints a table and, last, one JSON line. Kills its children on any exit.
 */
import { spawn } from 'node:child_process';
import { performance } from 'node:perf_hooks';
import { resolve } from 'node:path';
import { call } from '../test/helpers/http.js';
import { chatTurn } from './chat-turn.js';
import { EbbProcess, startWorker, type WorkerHandle } from '../test/helpers/processes.js';
import { arg } from './cli-arg.js';
import { percentile } from './percentile.js';
import { guardedDiscovery } from './run-guard.js';

const opts = {
  frontends: arg('frontends', '1,3,8').split(',').map(Number),
  workers: Number(arg('workers', '4')),
  clients: Number(arg('clients', '16')),
  seconds: Number(arg('seconds', '20')),
  turns: Number(arg('turns', '5')),
  docWords: Number(arg('doc-words', '2500')),
  kvBlocks: Number(arg('kv-blocks', '1024')),
  ebbCli: arg('ebb-cli', ''),
};
const BLOCK = 16;
/** Load before the clock starts: a fresh frontend's first requests pay for its JIT, and conversations reach every stage. */
const WARMUP_MS = 5000;
const MAX_TOKENS = 16;
const words = (n: number, tag: string) => Array.from({ length: n }, (_, i) => `${tag}${i.toString(36)}`).join(' ');

interface Turn {
  turn: number;
  ttftMs: number;
  prompt: number;
  cached: number;
  /** The previous turn's prompt tokens (0 for a first turn). */
  before: number;
  worker: string;
  /** The worker of the previous turn ('' for a first turn). */
  previous: string;
}


async function startFrontends(n: number, discovery: string, workers: WorkerHandle[]): Promise<Array<{ proc: EbbProcess; url: string }>> {
  const cli = opts.ebbCli === '' ? new URL('../bin/ebb.js', import.meta.url).pathname : resolve(opts.ebbCli);
  const out: Array<{ proc: EbbProcess; url: string }> = [];
  for (let i = 0; i < n; i++) {
    const proc = new EbbProcess(spawn(process.execPath, [cli, 'frontend', '--port', '0', '--discovery', discovery, '--shutdown-grace-ms', '0'], { env: { ...process.env, EBB_LOG_LEVEL: 'info' }, stdio: ['ignore', 'pipe', 'pipe'] }), `frontend-${i}`);
    out.push({ proc, url: (await proc.waitForEvent('frontend_ready')).url as string });
  }
  // Every frontend follows every worker's KV events before the clock starts.
  for (const fe of out) for (const w of workers) await fe.proc.waitForEvent('kv_stream_connected', (l) => l.worker_id === w.workerId);
  return out;
}

interface Row {
  frontends: number;
  later_turns: number;
  full_hits: number;
  full_hit_share: number;
  /** Later turns that missed on another worker than the previous turn's (routed away), and on the same one (evicted there). */
  missed_moved: number;
  missed_evicted: number;
  hit_rate: number;
  /** Conversations living on the worker a new one was sent to, itself included: p50 and max (cache pressure is the max against what a cache holds). */
  placed_beside_p50: number;
  placed_beside_max: number;
  ttft_p50_ms: number;
  ttft_p99_ms: number;
  errors: number;
}

async function run(n: number, discovery: string, workers: WorkerHandle[], tag: string): Promise<Row> {
  const frontends = await startFrontends(n, discovery, workers);
  try {
    const urls = frontends.map((f) => f.url);
    const systems = [0, 1, 2].map((i) => words(200, `${tag}s${i}x`));
    const turns: Turn[] = [];
    let errors = 0;
    let conversations = 0;
    /** Each running conversation's worker (that of its last turn). */
    const living = new Map<number, string>();
    const beside: number[] = [];
    const t0 = performance.now();
    // The clock starts once the load is steady (the frontends' code warm, conversations at every stage), not with a burst of new ones.
    const measureFrom = t0 + WARMUP_MS;
    const end = measureFrom + opts.seconds * 1000;
    const client = async () => {
      // Clients arrive over the first second, as people do, not all in one instant.
      await new Promise((done) => setTimeout(done, Math.random() * 1000));
      while (performance.now() < end) {
        const c = conversations++;
        const messages = [{ role: 'system', content: systems[c % 3]! }, { role: 'user', content: `${words(opts.docWords, `${tag}d${c}x`)} question 0` }];
        let before = 0;
        let previous = '';
        for (let t = 0; t < opts.turns && performance.now() < end; t++) {
          const sentAt = performance.now();
          try {
            const r = await chatTurn(urls[(c + t) % urls.length]!, messages, MAX_TOKENS);
            if (sentAt >= measureFrom) turns.push({ turn: t, ttftMs: r.ttftMs, prompt: r.prompt, cached: r.cached, before, worker: r.worker, previous });
            before = r.prompt;
            previous = r.worker;
            living.set(c, r.worker);
            if (t === 0 && sentAt >= measureFrom) {
              let n = 0;
              for (const w of living.values()) if (w === r.worker) n++;
              beside.push(n);
            }
            messages.push({ role: 'assistant', content: r.answer }, { role: 'user', content: `question ${t + 1} about ${tag}${c}` });
          } catch {
            if (sentAt >= measureFrom) errors++;
            break;
          }
          await new Promise((done) => setTimeout(done, 200 + Math.random() * 400)); // a person reads the answer
        }
        living.delete(c);
      }
    };
    await Promise.all(Array.from({ length: opts.clients }, client));
    const later = turns.filter((t) => t.turn > 0);
    const isFull = (t: Turn) => t.cached >= Math.floor(t.before / BLOCK) * BLOCK;
    const full = later.filter(isFull).length;
    const missed = later.filter((t) => !isFull(t));
    const ttft = turns.map((t) => t.ttftMs).sort((a, b) => a - b);
    const prompt = turns.reduce((a, t) => a + t.prompt, 0);
    return {
      frontends: n,
      later_turns: later.length,
      full_hits: full,
      full_hit_share: Math.round((full / Math.max(1, later.length)) * 1000) / 1000,
      missed_moved: missed.filter((t) => t.worker !== t.previous).length,
      missed_evicted: missed.filter((t) => t.worker === t.previous).length,
      hit_rate: Math.round((turns.reduce((a, t) => a + t.cached, 0) / Math.max(1, prompt)) * 1000) / 1000,
      placed_beside_p50: percentile(beside.sort((a, b) => a - b), 50),
      placed_beside_max: beside.length === 0 ? 0 : beside[beside.length - 1]!,
      ttft_p50_ms: Math.round(percentile(ttft, 50)),
      ttft_p99_ms: Math.round(percentile(ttft, 99)),
      errors,
    };
  } finally {
    for (const f of frontends) await f.proc.terminate();
  }
}

async function main(): Promise<void> {
  const discovery = guardedDiscovery('kv-affinity', 180_000 + opts.frontends.length * (opts.seconds + 30) * 1000);
  const args = ['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '10', '--mocker-max-context', '32768', '--mocker-batch-slots', '64', '--mocker-kv-blocks', String(opts.kvBlocks)];
  const workers: WorkerHandle[] = [];
  for (let i = 0; i < opts.workers; i++) workers.push(await startWorker(args));
  for (const w of workers)
    for (let i = 0; i < 5; i++) {
      const r = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: words(opts.docWords, `warm${i}x`), max_tokens: 4, stream: false });
      if (r.status !== 200) throw new Error(`warm-up on ${w.workerId}: HTTP ${r.status}`);
    }
  process.stdout.write(
    `kv affinity: ${opts.workers} mocker workers (${opts.kvBlocks} cache blocks each), ${opts.clients} clients, ${opts.turns} turns per conversation, turn t of conversation c at frontend (c + t) mod F, ${opts.seconds} s per frontend count\n`,
  );
  process.stdout.write('frontends  later turns  full hits  full-hit share  missed: moved / evicted  hit rate  placed beside p50 / max  TTFT p50  TTFT p99  errors\n');
  const rows: Row[] = [];
  for (const [i, n] of opts.frontends.entries()) {
    const row = await run(n, discovery, workers, `f${i}n${n}`);
    rows.push(row);
    process.stdout.write(
      `${String(n).padStart(9)}  ${String(row.later_turns).padStart(11)}  ${String(row.full_hits).padStart(9)}  ${row.full_hit_share.toFixed(3).padStart(14)}  ${`${row.missed_moved} / ${row.missed_evicted}`.padStart(23)}  ${row.hit_rate.toFixed(3).padStart(8)}  ${`${row.placed_beside_p50} / ${row.placed_beside_max}`.padStart(23)}  ${`${row.ttft_p50_ms} ms`.padStart(8)}  ${`${row.ttft_p99_ms} ms`.padStart(8)}  ${String(row.errors).padStart(6)}\n`,
    );
  }
  process.stdout.write(JSON.stringify({ bench: 'kv-affinity', ...opts, rows }) + '\n');
  await Promise.all(workers.map((w) => w.stop()));
  process.exit(0);
}

main().catch((err: unknown) => {
  process.stderr.write(`kv-affinity: ${(err as Error).stack ?? String(err)}\n`);
  process.exit(1);
});
