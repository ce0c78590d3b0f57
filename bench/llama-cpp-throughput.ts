/**
 * Tokens/s of the tiny generated llama model (issue 10): called in-process directly, through a
 * worker's request plane, and through the frontend, reported as ratios to the direct call.
 *
 * One llama-cpp engine per path, each with `--threads` threads and `--parallel` sequences, CPU only
 * (the same GGUF, written at start by the test helpers). For each concurrency, `c` closed loops
 * each send `--requests` requests of `--max-tokens` tokens (temperature 0, a plain prompt); the
 * paths alternate within each of `--rounds` rounds so a busy machine slows each path alike.
 * Throughput = completion tokens (as each path reports them) / wall time of the point. Every request
 * must deliver exactly `--max-tokens` tokens (the run fails otherwise).
 *
 *   npx tsc -p . && node dist/bench/llama-cpp-throughput.js [--concurrency 1,4] [--requests 6] [--max-tokens 64] [--rounds 2] [--threads 1] [--parallel 4]
 *
 * Prints a table and, last, one JSON line. Stops by itself (a watchdog bounds the run) and kills its
 * children on any exit.
 */
import { cpus } from 'node:os';
import { performance } from 'node:perf_hooks';
import { pino } from 'pino';
import { loadLlamaCppEngine, type LlamaCppEngine } from '../src/engine/llama-cpp.js';
import { splitBody } from '../test/helpers/http.js';
import { writeTinyLlamaGguf } from '../test/helpers/gguf.js';
import { killAllNow, startFrontend, startWorker, tempDiscoveryUrl, type FrontendHandle, type WorkerHandle } from '../test/helpers/processes.js';
import { procCpuMs } from './proc-cpu.js';

interface Options {
  concurrency: number[];
  requests: number;
  maxTokens: number;
  rounds: number;
  threads: number;
  parallel: number;
}

function parse(argv: string[]): Options {
  const o: Options = { concurrency: [1, 4], requests: 6, maxTokens: 64, rounds: 2, threads: 1, parallel: 4 };
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1] ?? ''];
    const n = Number(value);
    if (flag === '--concurrency') o.concurrency = value.split(',').map(Number);
    else if (flag === '--requests') o.requests = n;
    else if (flag === '--max-tokens') o.maxTokens = n;
    else if (flag === '--rounds') o.rounds = n;
    else if (flag === '--threads') o.threads = n;
    else if (flag === '--parallel') o.parallel = n;
    else throw new Error(`unknown option ${flag}; options: --concurrency --requests --max-tokens --rounds --threads --parallel`);
    if (flag !== '--concurrency' && !(Number.isInteger(n) && n >= 1)) throw new Error(`${flag} wants an integer >= 1, got "${value}"`);
  }
  if (o.concurrency.some((n) => !Number.isInteger(n) || n < 1)) throw new Error('--concurrency: integers >= 1');
  return o;
}

const MODEL = 'tiny';
const PROMPT = 'tell me about the tides';
type Path = 'direct' | 'worker' | 'frontend';
const PATHS: Path[] = ['direct', 'worker', 'frontend'];

/** One request on one path: the completion tokens it reports. */
type Send = () => Promise<number>;

function direct(engine: LlamaCppEngine, maxTokens: number): Send {
  return async () => {
    const g = engine.generate({ request_id: 'bench', prompt: PROMPT, max_tokens: maxTokens, temperature: 0 }, new AbortController().signal);
    for (;;) {
      const step = await g.next();
      if (step.done) return step.value.completion_tokens;
    }
  };
}

function viaWorker(w: WorkerHandle, maxTokens: number): Send {
  return async () => {
    const res = await fetch(`${w.requestUrl}/generate`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: PROMPT, max_tokens: maxTokens, temperature: 0 }),
    });
    if (res.status !== 200 || !res.body) throw new Error(`worker answered ${res.status}: ${await res.text()}`);
    let last = '';
    for await (const line of splitBody(res.body as AsyncIterable<Uint8Array>, '\n')) last = line;
    const end = JSON.parse(last) as { usage?: { completion_tokens: number } };
    if (!end.usage) throw new Error(`the stream did not complete: ${last}`);
    return end.usage.completion_tokens;
  };
}

function viaFrontend(f: FrontendHandle, maxTokens: number): Send {
  return async () => {
    // /v1/completions: the frontend passes the prompt as it is, so the worker does the same work.
    const res = await fetch(`${f.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: PROMPT, max_tokens: maxTokens, temperature: 0, stream: true, stream_options: { include_usage: true } }),
    });
    if (res.status !== 200 || !res.body) throw new Error(`frontend answered ${res.status}: ${await res.text()}`);
    let tokens: number | undefined;
    let done = false;
    for await (const event of splitBody(res.body as AsyncIterable<Uint8Array>, '\n\n')) {
      const data = event.startsWith('data: ') ? event.slice(6) : '';
      if (data === '[DONE]') done = true;
      else if (data.includes('"usage":{')) tokens = (JSON.parse(data) as { usage?: { completion_tokens: number } }).usage?.completion_tokens ?? tokens;
    }
    if (!done || tokens === undefined) throw new Error('the SSE stream did not complete');
    return tokens;
  };
}

/** User + system CPU ms of this process and the given children (Linux /proc; 0 for a child elsewhere). */
function cpuMs(pids: number[]): number {
  let ms = (process.cpuUsage().user + process.cpuUsage().system) / 1000;
  for (const pid of pids) ms += procCpuMs(pid) ?? 0; // not Linux: wall time only
  return ms;
}

interface Totals {
  tokens: number;
  seconds: number;
  /** CPU of every process on the path (this one, the worker, the frontend): robust to a busy machine. */
  cpuMs: number;
}

/** `c` closed loops of `requests` each; tokens, seconds and CPU for the point. */
async function point(send: Send, c: number, o: Options, pids: number[]): Promise<Totals> {
  const cpu0 = cpuMs(pids);
  const t0 = performance.now();
  const counts = await Promise.all(
    Array.from({ length: c }, async () => {
      let tokens = 0;
      for (let i = 0; i < o.requests; i++) {
        const n = await send();
        if (n !== o.maxTokens) throw new Error(`a request delivered ${n} of ${o.maxTokens} tokens`);
        tokens += n;
      }
      return tokens;
    }),
  );
  return { tokens: counts.reduce((a, b) => a + b, 0), seconds: (performance.now() - t0) / 1000, cpuMs: cpuMs(pids) - cpu0 };
}

async function main(): Promise<void> {
  const o = parse(process.argv.slice(2));
  const watchdog = setTimeout(() => {
    process.stderr.write('llama-cpp-throughput: watchdog fired, stopping\n');
    killAllNow();
    process.exit(3);
  }, 300_000);
  watchdog.unref();
  process.on('exit', killAllNow);

  const modelPath = writeTinyLlamaGguf();
  const flags = ['--engine', 'llama-cpp', '--model-path', modelPath, '--model', MODEL, '--gpu', 'off', '--threads', String(o.threads), '--parallel', String(o.parallel), '--context-size', '1024'];
  const discovery = tempDiscoveryUrl();
  const engine = await loadLlamaCppEngine(
    { modelPath, parallel: o.parallel, maxQueue: 1024, contextSize: 1024, threads: o.threads, gpu: 'off' },
    pino({ level: 'warn' }),
    new AbortController().signal,
  );
  const worker = await startWorker(['--discovery', discovery, ...flags]);
  const frontend = await startFrontend(discovery);
  await frontend.waitForLog(
    (l) => (l.event === 'discovery_reset' && (l.workers as string[]).includes(worker.workerId)) || (l.event === 'worker_added' && l.worker_id === worker.workerId),
    'the frontend routes to the worker',
  );
  const sends: Record<Path, Send> = { direct: direct(engine, o.maxTokens), worker: viaWorker(worker, o.maxTokens), frontend: viaFrontend(frontend, o.maxTokens) };
  for (const p of PATHS) await sends[p](); // warm-up: first-request costs (connections, grammar-free sampler setup)

  const totals = new Map<string, Totals>();
  const pids = [worker.pid, frontend.pid];
  for (let round = 0; round < o.rounds; round++) {
    for (const c of o.concurrency) {
      // Rotate which path goes first each round, so none always runs on the coolest machine.
      const order = PATHS.map((_, i) => PATHS[(i + round) % PATHS.length] as Path);
      for (const p of order) {
        const r = await point(sends[p], c, o, pids);
        const key = `${p}@${c}`;
        const t = totals.get(key) ?? { tokens: 0, seconds: 0, cpuMs: 0 };
        totals.set(key, { tokens: t.tokens + r.tokens, seconds: t.seconds + r.seconds, cpuMs: t.cpuMs + r.cpuMs });
      }
    }
  }

  const rate = (p: Path, c: number) => {
    const t = totals.get(`${p}@${c}`)!;
    return t.tokens / t.seconds;
  };
  const cpuPerToken = (p: Path, c: number) => {
    const t = totals.get(`${p}@${c}`)!;
    return (t.cpuMs * 1000) / t.tokens;
  };
  process.stdout.write(
    `tiny llama (${cpus().length} cores), threads ${o.threads}, parallel ${o.parallel}, max_tokens ${o.maxTokens}, ${o.requests} requests per loop, ${o.rounds} rounds\n`,
  );
  process.stdout.write(
    'concurrency  direct tok/s  worker tok/s  frontend tok/s  worker/direct  frontend/direct  frontend/worker  cpu µs/tok direct  worker  frontend\n',
  );
  const rows = o.concurrency.map((c) => {
    const [d, w, f] = [rate('direct', c), rate('worker', c), rate('frontend', c)];
    const row = {
      concurrency: c,
      direct_tok_s: Math.round(d),
      worker_tok_s: Math.round(w),
      frontend_tok_s: Math.round(f),
      worker_vs_direct: w / d,
      frontend_vs_direct: f / d,
      frontend_vs_worker: f / w,
      cpu_us_per_token: { direct: Math.round(cpuPerToken('direct', c)), worker: Math.round(cpuPerToken('worker', c)), frontend: Math.round(cpuPerToken('frontend', c)) },
    };
    const cpu = row.cpu_us_per_token;
    process.stdout.write(
      `${String(c).padStart(11)}  ${String(row.direct_tok_s).padStart(12)}  ${String(row.worker_tok_s).padStart(12)}  ${String(row.frontend_tok_s).padStart(14)}  ${row.worker_vs_direct.toFixed(3).padStart(13)}  ${row.frontend_vs_direct.toFixed(3).padStart(15)}  ${row.frontend_vs_worker.toFixed(3).padStart(15)}  ${String(cpu.direct).padStart(17)}  ${String(cpu.worker).padStart(6)}  ${String(cpu.frontend).padStart(8)}\n`,
    );
    return row;
  });
  process.stdout.write(
    JSON.stringify({ bench: 'llama-cpp-throughput', cores: cpus().length, threads: o.threads, parallel: o.parallel, max_tokens: o.maxTokens, requests_per_loop: o.requests, rounds: o.rounds, rows }) + '\n',
  );
  await engine.close();
  await Promise.all([frontend, worker].map((p) => p.stop()));
}

main().catch((err: unknown) => {
  process.stderr.write(`llama-cpp-throughput: ${(err as Error).stack ?? String(err)}\n`);
  process.exitCode = 1;
});
