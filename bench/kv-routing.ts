/**
 * Prefix-cache-aware routing on a multi-turn workload (issue 23): the kv router against
 * least-loaded and round-robin, in the same run, over the same mocker workers (real processes,
 * their prefix caches on: prefill costs time per uncached token, shared per worker).
 *
 * `--clients` loops each hold one conversation at a time: a shared system prompt (one of 3) and
 * the conversation's own document, then `--turns` turns, each appending a question and the answer
 * (streamed chat completions, usage included), 0.2-0.6 s apart. A conversation done, the loop
 * starts a new one. Each
 * router gets `--seconds` of this with its own documents and system prompts (no run finds another's
 * blocks); then kv and least-loaded once more with one worker drained halfway through the run.
 * Reported per run: TTFT p50/p99 (client-side, to the first content token), requests and tokens
 * per second, and the hit rate the workers reported (cached_tokens / prompt_tokens).
 *
 * Each worker's cache holds `--kv-blocks` blocks of 16 tokens (default 1,024: about six
 * conversations), as a GPU's KV memory holds a few long contexts, not every conversation of the
 * fleet: what one worker caches is lost when all of them see every conversation.
 *
 *   npx tsc -p . && node dist/bench/kv-routing.js [--workers 4] [--clients 16] [--seconds 15] [--turns 5] [--doc-words 2500] [--kv-blocks 1024]
 *
 * Prints a table and, last, one JSON line. Kills its children on any exit.
 */
import { performance } from 'node:perf_hooks';
import { call } from '../test/helpers/http.js';
import { chatTurn } from './chat-turn.js';
import { killAllNow, metricValue, startFrontend, startWorker, tempDiscoveryUrl, type FrontendHandle, type WorkerHandle } from '../test/helpers/processes.js';

interface Options {
  workers: number;
  clients: number;
  seconds: number;
  turns: number;
  docWords: number;
  kvBlocks: number;
}

function parse(argv: string[]): Options {
  const o: Options = { workers: 4, clients: 16, seconds: 15, turns: 5, docWords: 2500, kvBlocks: 1024 };
  const names: Record<string, keyof Options> = { '--workers': 'workers', '--clients': 'clients', '--seconds': 'seconds', '--turns': 'turns', '--doc-words': 'docWords', '--kv-blocks': 'kvBlocks' };
  for (let i = 0; i < argv.length; i += 2) {
    const key = names[argv[i] ?? ''];
    const n = Number(argv[i + 1]);
    if (key === undefined) throw new Error(`unknown option ${argv[i]}; options: ${Object.keys(names).join(' ')}`);
    if (!Number.isInteger(n) || n < 1) throw new Error(`${argv[i]} wants an integer >= 1`);
    o[key] = n;
  }
  return o;
}

const MAX_TOKENS = 16;
const words = (n: number, tag: string) => Array.from({ length: n }, (_, i) => `${tag}${i.toString(36)}`).join(' ');
const pct = (sorted: number[], p: number) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] ?? NaN;

interface Turn {
  ttftMs: number;
  prompt: number;
  cached: number;
  tokens: number;
  worker: string;
}


interface Row {
  router: string;
  drained: boolean;
  requests: number;
  ttft_p50_ms: number;
  ttft_p99_ms: number;
  req_per_s: number;
  tokens_per_s: number;
  hit_rate: number;
  predicted_hit_rate: number | null;
  errors: number;
}

async function run(o: Options, discovery: string, workers: WorkerHandle[], router: string, tag: string, drain: boolean): Promise<Row> {
  const frontend: FrontendHandle = await startFrontend(discovery, ['--router', router]);
  try {
    if (router === 'kv') for (const w of workers) await frontend.waitForEvent('kv_stream_connected', (l) => l.worker_id === w.workerId);
    const systems = [0, 1, 2].map((i) => words(200, `${tag}s${i}x`));
    let turns: Turn[] = [];
    let errors = 0;
    let conversations = 0;
    /** The clients' loops until `end`: conversations one after another, a think time between turns. */
    const load = (end: number, prefix: string) =>
      Array.from({ length: o.clients }, async () => {
        while (performance.now() < end) {
          const c = conversations++;
          const messages = [{ role: 'system', content: systems[c % 3]! }, { role: 'user', content: `${words(o.docWords, `${prefix}d${c}x`)} question 0` }];
          for (let t = 0; t < o.turns && performance.now() < end; t++) {
            try {
              const r = await chatTurn(frontend.url, messages, MAX_TOKENS);
              turns.push(r);
              messages.push({ role: 'assistant', content: r.answer }, { role: 'user', content: `question ${t + 1} about ${prefix}${c}` });
            } catch {
              errors++;
              break;
            }
            // A person reads the answer before the next turn (0.2-0.6 s here): other requests arrive
            // meanwhile, so the worker that just finished is not, by chance, the one that is free.
            await new Promise((resolve) => setTimeout(resolve, 200 + Math.random() * 400));
          }
        }
      });
    // A fresh frontend's first requests pay for its JIT (and the workers' KV event paths): a few
    // seconds of the same load, on prompts of their own, before the clock starts.
    await Promise.all(load(performance.now() + 3000, `${tag}warm`));
    turns = [];
    errors = 0;
    const t0 = performance.now();
    const end = t0 + o.seconds * 1000;
    const loops = load(end, tag);
    let drained: WorkerHandle | undefined;
    if (drain) {
      await new Promise((resolve) => setTimeout(resolve, (o.seconds * 1000) / 2)); // the bench's clock: half the run
      drained = workers[0]!;
      const mark = drained.mark();
      const r = await call('POST', `${drained.systemUrl}/engine/drain`, { reason: 'kv-routing bench' });
      if (r.status !== 200 && r.status !== 202) throw new Error(`drain answered ${r.status}`);
      if (r.body.state !== 'drained') await drained.waitForEvent('state_changed', (l) => l.to === 'drained', { after: mark });
    }
    await Promise.all(loops);
    const seconds = (performance.now() - t0) / 1000;
    const predicted = router === 'kv' ? (await metricValue(frontend.url, 'ebb_frontend_kv_overlap_tokens_total')) / Math.max(1, await metricValue(frontend.url, 'ebb_frontend_kv_prompt_tokens_total')) : null;
    if (drained) {
      const back = frontend.mark();
      await call('POST', `${drained.systemUrl}/engine/resume`);
      await frontend.waitForEvent('worker_added', (l) => l.worker_id === drained.workerId, { after: back });
    }
    const ttft = turns.map((t) => t.ttftMs).sort((a, b) => a - b);
    const prompt = turns.reduce((a, t) => a + t.prompt, 0);
    return {
      router,
      drained: drain,
      requests: turns.length,
      ttft_p50_ms: Math.round(pct(ttft, 50)),
      ttft_p99_ms: Math.round(pct(ttft, 99)),
      req_per_s: Math.round((turns.length / seconds) * 10) / 10,
      tokens_per_s: Math.round(turns.reduce((a, t) => a + t.tokens, 0) / seconds),
      hit_rate: Math.round((turns.reduce((a, t) => a + t.cached, 0) / Math.max(1, prompt)) * 1000) / 1000,
      predicted_hit_rate: predicted === null ? null : Math.round(predicted * 1000) / 1000,
      errors,
    };
  } finally {
    await frontend.stop();
  }
}

async function main(): Promise<void> {
  const o = parse(process.argv.slice(2));
  const watchdog = setTimeout(() => {
    process.stderr.write('kv-routing: watchdog fired, stopping\n');
    killAllNow();
    process.exit(3);
  }, 120_000 + 6 * o.seconds * 3000);
  watchdog.unref();
  process.on('exit', killAllNow);
  const discovery = tempDiscoveryUrl();
  // The mocker's prefill default: 12,000 uncached prompt tokens/s per worker, shared by its prefills.
  const args = ['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '10', '--mocker-max-context', '32768', '--mocker-batch-slots', '64', '--mocker-kv-blocks', String(o.kvBlocks)];
  const workers: WorkerHandle[] = [];
  for (let i = 0; i < o.workers; i++) workers.push(await startWorker(args)); // one at a time: a loaded machine starts them slowly
  // The workers' first requests pay for their JIT: a few on each, straight to its request plane.
  for (const w of workers)
    for (let i = 0; i < 5; i++) {
      const r = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: words(o.docWords, `warm${i}x`), max_tokens: 4, stream: false });
      if (r.status !== 200) throw new Error(`warm-up on ${w.workerId}: HTTP ${r.status}`);
    }
  process.stdout.write(`${o.workers} mocker workers, ${o.clients} clients, ${o.seconds} s per run, ${o.turns} turns per conversation, ${o.docWords}-word documents + 200-word system prompts, ${o.kvBlocks} cache blocks per worker\n`);
  process.stdout.write('router        drained  requests  TTFT p50  TTFT p99   req/s  tokens/s  hit rate (workers)  predicted\n');
  // The first sustained load finds the workers' code cold (their direct warm-up above is a few
  // requests): one unreported kv run takes that, so the first reported run is not penalised for it.
  await run({ ...o, seconds: 5 }, discovery, workers, 'kv', 'warm', false);
  const rows: Row[] = [];
  const plan: Array<[string, boolean]> = [['kv', false], ['least-loaded', false], ['round-robin', false], ['kv', true], ['least-loaded', true]];
  for (const [i, [router, drain]] of plan.entries()) {
    const row = await run(o, discovery, workers, router, `r${i}`, drain);
    rows.push(row);
    process.stdout.write(
      `${row.router.padEnd(13)} ${String(row.drained).padEnd(7)}  ${String(row.requests).padStart(8)}  ${`${row.ttft_p50_ms} ms`.padStart(8)}  ${`${row.ttft_p99_ms} ms`.padStart(8)}  ${String(row.req_per_s).padStart(6)}  ${String(row.tokens_per_s).padStart(8)}  ${row.hit_rate.toFixed(3).padStart(18)}  ${row.predicted_hit_rate?.toFixed(3) ?? '-'}${row.errors ? `  (${row.errors} errors)` : ''}\n`,
    );
  }
  const p50 = (router: string, drained: boolean) => rows.find((r) => r.router === router && r.drained === drained)!.ttft_p50_ms;
  const ratio = Math.round((p50('kv', false) / p50('least-loaded', false)) * 100) / 100;
  const ratioDrained = Math.round((p50('kv', true) / p50('least-loaded', true)) * 100) / 100;
  process.stdout.write(`kv TTFT p50 / least-loaded: ${ratio} (goal <= 0.5); with a worker drained mid-run: ${ratioDrained}\n`);
  process.stdout.write(JSON.stringify({ bench: 'kv-routing', ...o, rows, kv_over_least_loaded_p50: ratio, kv_over_least_loaded_p50_drained: ratioDrained }) + '\n');
  await Promise.all(workers.map((w) => w.stop()));
}

main().catch((err: unknown) => {
  process.stderr.write(`kv-routing: ${(err as Error).stack ?? String(err)}\n`);
  process.exitCode = 1;
});
