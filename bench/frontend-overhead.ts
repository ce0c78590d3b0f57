/**
 * Frontend overhead benchmark (issue 3).
 *
 * Starts one mocker worker (itl 0, ttft 0) and one frontend as child processes on loopback and, at
 * each concurrency, drives closed-loop streaming load twice: straight at the worker's request plane
 * (POST /generate, NDJSON) and through the frontend (POST /v1/chat/completions, SSE). The worker
 * does the same work either way, so the difference is what the frontend's relay costs. A third
 * path, openai-port, is the worker's own OpenAI API (`ebb worker --openai-port`): the frontend's code
 * in the worker's process, one loopback hop to its own request plane. A fourth, frontend-limits, is
 * a second frontend with tenant limits on (--limits-file, counted in a Redis --stream-store this
 * bench starts): each request reserves and settles its tenant's limits there (limits far above the
 * load, so none is refused); against frontend, the hot-path cost of the limits (issue 48).
 *
 *   npx tsc -p . && node dist/bench/frontend-overhead.js [--duration-ms 4000] [--max-tokens 64]
 *     [--warmup-ms 1000] [--rounds 1] [--concurrency 1,16,64] [--paths direct,frontend,openai-port,frontend-limits] [--json-parse]
 *     [--frontend-node-args "--cpu-prof --cpu-prof-dir=/tmp/prof"]
 *
 * Children run under the test helpers' process runner, and streams are split by their splitBody.
 * This is a benchmark, not a test: it prints a table and, last, one JSON line with the ratios.
 * It always stops by itself (a watchdog bounds the whole run) and kills its children on any exit.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { availableParallelism, cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Agent, request } from 'undici';
import { splitBody } from '../test/helpers/http.js';
import { bounded, killAllNow, startFrontend, startWorker, type EbbProcess, type FrontendHandle, type WorkerHandle } from '../test/helpers/processes.js';
import { CLOCK_TICKS, procCpuMs } from './proc-cpu.js';
import { procPeakRssBytes } from './proc-memory.js';
import { percentile } from './percentile.js';
import { startRedis, type RedisServer } from '../test/helpers/redis.js';

const MODEL = 'm1';
const CONTENT = 'tell me about tides';

// ---------------------------------------------------------------------------------------------
// Options

interface Options {
  durationMs: number;
  warmupMs: number;
  rounds: number;
  maxTokens: number;
  concurrency: number[];
  paths: Path[];
  jsonParse: boolean;
  frontendNodeArgs: string[];
  workerNodeArgs: string[];
}

type Path = 'direct' | 'frontend' | 'openai-port' | 'frontend-limits';
const PATHS: readonly Path[] = ['direct', 'frontend', 'openai-port', 'frontend-limits'];
/** The frontend paths: their frontend's CPU per token is reported. */
const viaFrontend = (p: Path) => p === 'frontend' || p === 'frontend-limits';

class UsageError extends Error {}

function usage(): string {
  return [
    'usage: node dist/bench/frontend-overhead.js [options]',
    '  --duration-ms <n>          measured time per point and path (default 4000)',
    '  --warmup-ms <n>            unmeasured load before each point and path (default 1000)',
    '  --rounds <n>               measure each point n times, alternating paths, and pool the samples (default 1)',
    '  --max-tokens <n>           tokens per request (default 64)',
    '  --concurrency <list>       concurrent streams per point (default 1,16,64)',
    '  --paths <list>             direct,frontend,openai-port,frontend-limits (default direct,frontend; ratios are against direct)',
    '  --json-parse               JSON.parse every token line/event on the client (default: scan only)',
    '  --frontend-node-args <s>   extra node flags for the frontend child, e.g. "--cpu-prof --cpu-prof-dir=/tmp/p"',
    '  --worker-node-args <s>     extra node flags for the worker child',
  ].join('\n');
}

function parseOptions(argv: string[]): Options {
  const o: Options = {
    durationMs: 4000,
    warmupMs: 1000,
    rounds: 1,
    maxTokens: 64,
    concurrency: [1, 16, 64],
    paths: ['direct', 'frontend'],
    jsonParse: false,
    frontendNodeArgs: [],
    workerNodeArgs: [],
  };
  const int = (flag: string, v: string | undefined, min: number): number => {
    const n = Number(v);
    if (v === undefined || !Number.isInteger(n) || n < min) throw new UsageError(`${flag}: expected an integer >= ${min}, got "${v}"`);
    return n;
  };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i] as string;
    const [name, inline] = flag.includes('=') && flag.startsWith('--') ? [flag.slice(0, flag.indexOf('=')), flag.slice(flag.indexOf('=') + 1)] : [flag, undefined];
    const value = () => inline ?? argv[++i];
    switch (name) {
      case '--duration-ms':
        o.durationMs = int(name, value(), 100);
        break;
      case '--warmup-ms':
        o.warmupMs = int(name, value(), 0);
        break;
      case '--rounds':
        o.rounds = int(name, value(), 1);
        break;
      case '--max-tokens':
        o.maxTokens = int(name, value(), 1);
        break;
      case '--concurrency':
        o.concurrency = (value() ?? '').split(',').map((s) => int(name, s.trim(), 1));
        break;
      case '--paths': {
        const ps = (value() ?? '').split(',').map((s) => s.trim());
        for (const p of ps) if (!PATHS.includes(p as Path)) throw new UsageError(`--paths: unknown path "${p}"`);
        o.paths = ps as Path[];
        break;
      }
      case '--json-parse':
        o.jsonParse = true;
        break;
      case '--frontend-node-args':
        o.frontendNodeArgs = (value() ?? '').split(/\s+/).filter(Boolean);
        break;
      case '--worker-node-args':
        o.workerNodeArgs = (value() ?? '').split(/\s+/).filter(Boolean);
        break;
      case '--help':
      case '-h':
        console.log(usage());
        process.exit(0);
      default:
        throw new UsageError(`unknown argument "${flag}"\n${usage()}`);
    }
  }
  return o;
}

// ---------------------------------------------------------------------------------------------
// Child processes: the test helpers' runner (it always reads both pipes: a child blocked on a full
// stdout pipe would look like a slow server); killAllNow on every way out of this process.

/** Discovery directories this run created; removed on any exit. */
const tempDirs = new Set<string>();

process.on('exit', () => {
  killAllNow();
  for (const dir of tempDirs) rmSync(dir, { recursive: true, force: true });
});
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
  process.on(sig, () => {
    console.error(`bench: ${sig}; killing children`);
    killAllNow();
    process.exit(130);
  });
}

/** The last lines a child wrote, for an error message. */
function tail(p: EbbProcess, n = 40): string {
  return [...p.logs.map((l) => JSON.stringify(l)), ...p.stderr.map((l) => `[stderr] ${l}`)].slice(-n).join('\n');
}

/** Rejects when `p` exits before `stopping()` says we asked it to; otherwise never settles. */
function unexpectedExit(p: EbbProcess, stopping: () => boolean): Promise<never> {
  const died = p.exited.then((code) => {
    if (stopping()) return new Promise<never>(() => undefined);
    throw new Error(`${p.label} exited unexpectedly (code ${code})\n${tail(p)}`);
  });
  died.catch(() => undefined); // observed where it matters; never an unhandled rejection
  return died;
}

// ---------------------------------------------------------------------------------------------
// CPU accounting (Linux /proc; absent elsewhere, which only blanks the cpu columns)


/** Busy CPU time of the whole machine (all cores), in ms; undefined where /proc is not available. */
function machineBusyMs(): number | undefined {
  try {
    const cpu = readFileSync('/proc/stat', 'utf8').split('\n', 1)[0] as string;
    const [user, nice, system, , , irq, softirq, steal] = cpu.trim().split(/\s+/).slice(1).map(Number) as number[];
    return (((user ?? 0) + (nice ?? 0) + (system ?? 0) + (irq ?? 0) + (softirq ?? 0) + (steal ?? 0)) * 1000) / CLOCK_TICKS;
  } catch {
    return undefined;
  }
}

function selfCpuMs(): number {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
}

// ---------------------------------------------------------------------------------------------
// Load client

interface Sample {
  ttftMs: number;
  totalMs: number;
  tokens: number;
}

interface Target {
  path: Path;
  url: string;
  body: string;
  /** Extra request headers (the limits path's tenant). */
  headers?: Record<string, string>;
  /** Reads a whole response body, counting token lines/events; throws on a malformed or short stream. */
  consume(body: AsyncIterable<Uint8Array>, onFirstToken: () => void): Promise<number>;
}

/** NDJSON from the worker: one `{"text":...}` line per token, then `{"done":true,...}`. */
function ndjsonConsumer(jsonParse: boolean): Target['consume'] {
  return async (body, onFirstToken) => {
    let tokens = 0;
    let done = false;
    const onLine = (line: string) => {
      if (done) throw new Error(`line after the done line: ${line}`);
      if (line.startsWith('{"text":')) {
        if (jsonParse && typeof (JSON.parse(line) as { text?: unknown }).text !== 'string') throw new Error(`bad token line: ${line}`);
        if (tokens++ === 0) onFirstToken();
        return;
      }
      const parsed = JSON.parse(line) as { done?: boolean; usage?: { completion_tokens?: number }; error?: { message?: string } };
      if (parsed.error) throw new Error(`worker error line: ${parsed.error.message}`);
      if (parsed.done !== true) throw new Error(`unexpected line: ${line}`);
      if (parsed.usage?.completion_tokens !== tokens) throw new Error(`counted ${tokens} tokens, worker reported ${parsed.usage?.completion_tokens}`);
      done = true;
    };
    for await (const line of splitBody(body, '\n')) onLine(line);
    if (!done) throw new Error('stream ended without a done line');
    return tokens;
  };
}

/** SSE from the frontend: a role-only opening event, one event per token, a finish event, `[DONE]`. */
function sseConsumer(jsonParse: boolean): Target['consume'] {
  return async (body, onFirstToken) => {
    let tokens = 0;
    let done = false;
    const onEvent = (withId: string) => {
      // A kept (resumable) stream's events start with their `id:` line.
      const event = withId.startsWith('id: ') ? withId.slice(withId.indexOf('\n') + 1) : withId;
      // A partial trailing event (splitBody yields the rest of the body too) lands here or breaks [DONE].
      if (done) throw new Error(`SSE event after [DONE]: ${event}`);
      if (!event.startsWith('data: ')) throw new Error(`unexpected SSE event: ${event}`);
      if (event === 'data: [DONE]') {
        done = true;
        return;
      }
      let isToken: boolean;
      if (jsonParse) {
        const parsed = JSON.parse(event.slice(6)) as { error?: { message?: string }; choices?: Array<{ delta?: { content?: unknown } }> };
        if (parsed.error) throw new Error(`frontend error event: ${parsed.error.message}`);
        const content = parsed.choices?.[0]?.delta?.content;
        isToken = typeof content === 'string' && content.length > 0;
      } else {
        if (event.startsWith('data: {"error"')) throw new Error(`frontend error event: ${event}`);
        // Token events carry `"delta":{"content":"..."`; the opening event has a role first and an empty content.
        isToken = event.includes('"delta":{"content":"');
      }
      if (isToken && tokens++ === 0) onFirstToken();
    };
    for await (const event of splitBody(body, '\n\n')) onEvent(event);
    if (!done) throw new Error('stream ended without [DONE]');
    return tokens;
  };
}

async function oneRequest(agent: Agent, t: Target, expectTokens: number): Promise<Sample> {
  const started = performance.now();
  let first = -1;
  const res = await request(t.url, { method: 'POST', headers: { 'content-type': 'application/json', ...t.headers }, body: t.body, dispatcher: agent });
  if (res.statusCode !== 200) {
    const text = await res.body.text();
    throw new Error(`${t.path}: HTTP ${res.statusCode}: ${text.slice(0, 300)}`);
  }
  const tokens = await t.consume(res.body as AsyncIterable<Uint8Array>, () => {
    first = performance.now();
  });
  const end = performance.now();
  if (tokens !== expectTokens) throw new Error(`${t.path}: expected ${expectTokens} tokens, got ${tokens}`);
  return { ttftMs: first - started, totalMs: end - started, tokens };
}

interface PhaseResult {
  samples: Sample[];
  errors: number;
  firstError?: string;
  elapsedMs: number;
  cpuMs: { client?: number | undefined; frontend?: number | undefined; worker?: number | undefined; other?: number | undefined };
}

function merge(a: PhaseResult, b: PhaseResult): PhaseResult {
  const add = (x: number | undefined, y: number | undefined) => (x === undefined || y === undefined ? undefined : x + y);
  const out: PhaseResult = {
    samples: a.samples.concat(b.samples),
    errors: a.errors + b.errors,
    elapsedMs: a.elapsedMs + b.elapsedMs,
    cpuMs: {
      client: add(a.cpuMs.client, b.cpuMs.client),
      frontend: add(a.cpuMs.frontend, b.cpuMs.frontend),
      worker: add(a.cpuMs.worker, b.cpuMs.worker),
      other: add(a.cpuMs.other, b.cpuMs.other),
    },
  };
  const firstError = a.firstError ?? b.firstError;
  if (firstError !== undefined) out.firstError = firstError;
  return out;
}

/** `concurrency` closed loops, each issuing its next request as soon as the previous one ended, until `ms` passed. */
async function runPhase(agent: Agent, t: Target, concurrency: number, ms: number, expectTokens: number, pids: { frontend: number; worker: number }, abort: Promise<never>): Promise<PhaseResult> {
  const samples: Sample[] = [];
  let errors = 0;
  let firstError: string | undefined;
  const cpu0 = { client: selfCpuMs(), frontend: procCpuMs(pids.frontend), worker: procCpuMs(pids.worker), machine: machineBusyMs() };
  const t0 = performance.now();
  const deadline = t0 + ms;
  const loop = async () => {
    while (performance.now() < deadline) {
      try {
        samples.push(await oneRequest(agent, t, expectTokens));
      } catch (err) {
        errors++;
        firstError ??= (err as Error).message;
        if (errors > 100) throw new Error(`too many errors on ${t.path}; first: ${firstError}`);
        await sleep(10);
      }
    }
  };
  await Promise.race([Promise.all(Array.from({ length: concurrency }, loop)), abort]);
  const elapsedMs = performance.now() - t0;
  const cpu1 = { client: selfCpuMs(), frontend: procCpuMs(pids.frontend), worker: procCpuMs(pids.worker), machine: machineBusyMs() };
  const diff = (a: number | undefined, b: number | undefined) => (a === undefined || b === undefined ? undefined : b - a);
  const client = cpu1.client - cpu0.client;
  const frontend = diff(cpu0.frontend, cpu1.frontend);
  const worker = diff(cpu0.worker, cpu1.worker);
  const machine = diff(cpu0.machine, cpu1.machine);
  // Everything else running on the machine meanwhile (other tests, builds): a noisy neighbour shows here.
  const other = machine === undefined || frontend === undefined || worker === undefined ? undefined : Math.max(0, machine - client - frontend - worker);
  const res: PhaseResult = { samples, errors, elapsedMs, cpuMs: { client, frontend, worker, other } };
  if (firstError !== undefined) res.firstError = firstError;
  return res;
}

// ---------------------------------------------------------------------------------------------
// Statistics and output

interface PointStats {
  path: Path;
  concurrency: number;
  requests: number;
  errors: number;
  firstError?: string;
  reqPerS: number;
  tokPerS: number;
  ttftP50: number;
  ttftP99: number;
  totalP50: number;
  totalP99: number;
  cpuPct: { client?: number | undefined; frontend?: number | undefined; worker?: number | undefined; other?: number | undefined };
  /** Frontend CPU time per relayed token, in µs (only meaningful on the frontend path). */
  frontendCpuUsPerToken?: number;
  workerCpuUsPerToken?: number;
}

function summarise(path: Path, concurrency: number, r: PhaseResult): PointStats {
  const ttft = r.samples.map((s) => s.ttftMs).sort((a, b) => a - b);
  const total = r.samples.map((s) => s.totalMs).sort((a, b) => a - b);
  const tokens = r.samples.reduce((n, s) => n + s.tokens, 0);
  const pct = (ms: number | undefined) => (ms === undefined ? undefined : (100 * ms) / r.elapsedMs);
  const perTok = (ms: number | undefined) => (ms === undefined || tokens === 0 ? undefined : (1000 * ms) / tokens);
  const s: PointStats = {
    path,
    concurrency,
    requests: r.samples.length,
    errors: r.errors,
    reqPerS: (1000 * r.samples.length) / r.elapsedMs,
    tokPerS: (1000 * tokens) / r.elapsedMs,
    ttftP50: percentile(ttft, 50),
    ttftP99: percentile(ttft, 99),
    totalP50: percentile(total, 50),
    totalP99: percentile(total, 99),
    cpuPct: { client: pct(r.cpuMs.client), frontend: pct(r.cpuMs.frontend), worker: pct(r.cpuMs.worker), other: pct(r.cpuMs.other) },
  };
  const fe = perTok(r.cpuMs.frontend);
  const wk = perTok(r.cpuMs.worker);
  if (fe !== undefined) s.frontendCpuUsPerToken = fe;
  if (wk !== undefined) s.workerCpuUsPerToken = wk;
  if (r.firstError !== undefined) s.firstError = r.firstError;
  return s;
}

/** What most likely capped a point: one process at a full core (node is single-threaded), or all cores busy. */
function limitOf(s: PointStats, cores: number): string {
  const { client, frontend, worker, other } = s.cpuPct;
  if (client === undefined || frontend === undefined || worker === undefined) return '-';
  const named: Array<[string, number]> = [['worker', worker], ['frontend', frontend], ['client', client]];
  const pinned = named.filter(([, v]) => v >= 93).map(([k]) => k);
  if (pinned.length > 0) return `${pinned.join('+')} core`;
  if (client + frontend + worker + (other ?? 0) >= 85 * cores) return 'all cores';
  return 'latency';
}

const round = (n: number, digits = 2) => (Number.isFinite(n) ? Number(n.toFixed(digits)) : null);

function fmt(n: number | undefined, digits = 1): string {
  return n === undefined || !Number.isFinite(n) ? '-' : n.toFixed(digits);
}

function table(header: string[], rows: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) => cells.map((c, i) => (i < 2 ? c.padEnd(widths[i] as number) : c.padStart(widths[i] as number))).join('  ');
  return [line(header), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.map(line)].join('\n');
}

// ---------------------------------------------------------------------------------------------
// Main

async function main(): Promise<void> {
  const opts = parseOptions(process.argv.slice(2));
  const cores = typeof availableParallelism === 'function' ? availableParallelism() : cpus().length;

  // Hard bound on the whole run, whatever happens: start-up, every phase twice over, and shutdown.
  const phases = opts.concurrency.length * opts.paths.length;
  const budgetMs = 60_000 + phases * (opts.warmupMs + opts.rounds * opts.durationMs) * 3;
  const watchdog = setTimeout(() => {
    console.error(`bench: watchdog: still running after ${budgetMs} ms; killing children and exiting`);
    killAllNow();
    process.exit(2);
  }, budgetMs);
  watchdog.unref();

  const dir = mkdtempSync(join(tmpdir(), 'ebb-bench-discovery-'));
  tempDirs.add(dir);
  const discovery = `file://${dir}`;
  let worker: WorkerHandle | undefined;
  let frontend: FrontendHandle | undefined;
  let limited: FrontendHandle | undefined;
  let redis: RedisServer | undefined;
  let stopping = false;
  const agent = new Agent({
    connections: Math.max(...opts.concurrency) * 2,
    pipelining: 1,
    keepAliveTimeout: 30_000,
    keepAliveMaxTimeout: 60_000,
    headersTimeout: 15_000,
    bodyTimeout: 15_000,
  });

  try {
    worker = await startWorker(
      ['--discovery', discovery, '--model', MODEL, '--mocker-itl-ms', '0', '--mocker-ttft-ms', '0', '--mocker-batch-slots', '256', '--shutdown-grace-ms', '0', '--drain-timeout-ms', '1000', ...(opts.paths.includes('openai-port') ? ['--openai-port', '0'] : [])],
      {},
      { nodeArgs: opts.workerNodeArgs },
    );
    const requestUrl = worker.requestUrl;
    frontend = await startFrontend(discovery, ['--shutdown-grace-ms', '0'], {}, { nodeArgs: opts.frontendNodeArgs }); // no balancer to wait for: exit (and write a --cpu-prof file) at once
    const frontendUrl = frontend.url;
    if (opts.paths.includes('frontend-limits')) {
      redis = await startRedis();
      // Limits far above the load: every request reserves and settles in Redis, none is refused.
      const limitsDir = mkdtempSync(join(tmpdir(), 'ebb-bench-limits-'));
      tempDirs.add(limitsDir);
      const limitsFile = join(limitsDir, 'limits.json');
      writeFileSync(limitsFile, JSON.stringify({ bench: { requests_per_minute: 1e9, tokens_per_minute: 1e12, concurrent_streams: 1e6, tokens_per_day: 1e15 } }));
      limited = await startFrontend(discovery, ['--shutdown-grace-ms', '0', '--stream-store', redis.url, '--limits-file', limitsFile], {}, { nodeArgs: opts.frontendNodeArgs });
    }
    const childDied = Promise.race([unexpectedExit(worker, () => stopping), unexpectedExit(frontend, () => stopping), ...(limited ? [unexpectedExit(limited, () => stopping)] : [])]);
    childDied.catch(() => undefined);

    // The frontend learns about the worker through discovery: its routing view says when it has.
    const id = worker.workerId;
    for (const f of limited ? [frontend, limited] : [frontend])
      await f.waitForLog(
        (l) => (l.event === 'discovery_reset' && (l.workers as string[]).includes(id)) || (l.event === 'worker_added' && l.worker_id === id),
        'the frontend to see the worker in discovery',
      );

    const targets: Record<Path, Target> = {
      direct: {
        path: 'direct',
        url: `${requestUrl}/generate`,
        // The frontend turns chat messages into this same prompt, so the worker does identical work.
        body: JSON.stringify({ model: MODEL, prompt: `user: ${CONTENT}`, max_tokens: opts.maxTokens, stream: true }),
        consume: ndjsonConsumer(opts.jsonParse),
      },
      frontend: {
        path: 'frontend',
        url: `${frontendUrl}/v1/chat/completions`,
        body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: CONTENT }], max_tokens: opts.maxTokens, stream: true }),
        consume: sseConsumer(opts.jsonParse),
      },
      'frontend-limits': {
        path: 'frontend-limits',
        url: `${limited?.url ?? 'http://not-asked-for'}/v1/chat/completions`,
        headers: { 'x-ebb-tenant': 'bench' },
        body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: CONTENT }], max_tokens: opts.maxTokens, stream: true }),
        consume: sseConsumer(opts.jsonParse),
      },
      'openai-port': {
        path: 'openai-port',
        url: `${worker.openaiUrl ?? 'http://not-asked-for'}/v1/chat/completions`,
        body: JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: CONTENT }], max_tokens: opts.maxTokens, stream: true }),
        consume: sseConsumer(opts.jsonParse),
      },
    };
    const pids = { frontend: frontend.pid, worker: worker.pid };
    // Each frontend path's CPU is its own frontend's.
    const pidsOf = (p: Path) => (p === 'frontend-limits' && limited ? { ...pids, frontend: limited.pid } : pids);

    // Smoke check both paths once, so a broken setup fails fast with a clear message.
    for (const p of opts.paths) await bounded(oneRequest(agent, targets[p], opts.maxTokens), `smoke request on ${p}`, 10_000);

    console.log(
      `ebb frontend overhead: 1 mocker worker (itl 0 ms, ttft 0 ms, 256 slots) + 1 frontend on loopback; ` +
        `max_tokens ${opts.maxTokens}, ${opts.rounds} x ${opts.durationMs} ms per point and path after ${opts.warmupMs} ms warm-up; client token scan: ${opts.jsonParse ? 'JSON.parse' : 'string scan'}`,
    );
    console.log(
      `NOTE: this machine has ${cores} CPU core(s), shared by the load generator, the frontend and the worker ` +
        `(node ${process.version}). With an instant mocker every path is CPU-bound: throughput measures CPU cost per token, ` +
        `and the frontend path runs three busy processes where the direct path runs two.`,
    );

    const stats: PointStats[] = [];
    for (const c of opts.concurrency) {
      if (opts.warmupMs > 0) for (const p of opts.paths) await runPhase(agent, targets[p], c, opts.warmupMs, opts.maxTokens, pidsOf(p), childDied);
      const pooled = new Map<Path, PhaseResult>();
      for (let round = 0; round < opts.rounds; round++) {
        // Alternate which path goes first, so slow drift (or a noisy neighbour) hits both alike.
        const order = round % 2 === 0 ? opts.paths : [...opts.paths].reverse();
        for (const p of order) {
          const r = await runPhase(agent, targets[p], c, opts.durationMs, opts.maxTokens, pidsOf(p), childDied);
          const prev = pooled.get(p);
          pooled.set(p, prev ? merge(prev, r) : r);
          const tok = (1000 * r.samples.reduce((n, x) => n + x.tokens, 0)) / r.elapsedMs;
          const other = r.cpuMs.other === undefined ? '' : `, other processes ${fmt((100 * r.cpuMs.other) / r.elapsedMs, 0)}% cpu`;
          process.stderr.write(`  c=${c} ${p} round ${round + 1}/${opts.rounds}: ${fmt(tok, 0)} tok/s${other}${r.errors ? `, ${r.errors} errors (${r.firstError})` : ''}\n`);
        }
      }
      for (const p of opts.paths) stats.push(summarise(p, c, pooled.get(p) as PhaseResult));
    }

    console.log('');
    console.log(
      'cpu% = share of one core during the measured window (client = this load generator); fe µs/tok = frontend CPU per relayed token; ' +
        'limit = a process pinned at one core (node is single-threaded), all cores busy, or neither (latency-bound).',
    );
    console.log(
      table(
        ['conc', 'path', 'req/s', 'tok/s', 'ttft p50 ms', 'ttft p99 ms', 'total p50 ms', 'total p99 ms', 'cpu% client', 'cpu% frontend', 'cpu% worker', 'cpu% other', 'fe µs/tok', 'limit', 'errors'],
        stats.map((s) => [
          String(s.concurrency),
          s.path,
          fmt(s.reqPerS, 0),
          fmt(s.tokPerS, 0),
          fmt(s.ttftP50, 2),
          fmt(s.ttftP99, 2),
          fmt(s.totalP50, 2),
          fmt(s.totalP99, 2),
          fmt(s.cpuPct.client, 0),
          fmt(s.cpuPct.frontend, 0),
          fmt(s.cpuPct.worker, 0),
          fmt(s.cpuPct.other, 0),
          viaFrontend(s.path) ? fmt(s.frontendCpuUsPerToken, 1) : '-',
          limitOf(s, cores),
          String(s.errors),
        ]),
      ),
    );

    // Each relaying path against direct: the frontend, and the worker's own OpenAI port.
    const ratios = opts.concurrency.flatMap((c) => {
      const d = stats.find((s) => s.concurrency === c && s.path === 'direct');
      if (!d) return [];
      return stats
        .filter((f) => f.concurrency === c && f.path !== 'direct')
        .map((f) => ({
          concurrency: c,
          path: f.path,
          ttft_p50_ratio: round(f.ttftP50 / d.ttftP50, 3),
          tok_per_s_ratio: round(f.tokPerS / d.tokPerS, 3),
          req_per_s_ratio: round(f.reqPerS / d.reqPerS, 3),
          added_ttft_ms_p50: round(f.ttftP50 - d.ttftP50, 3),
          added_ttft_ms_p99: round(f.ttftP99 - d.ttftP99, 3),
          added_total_ms_p50: round(f.totalP50 - d.totalP50, 3),
          added_total_ms_p99: round(f.totalP99 - d.totalP99, 3),
          direct_tok_per_s: round(d.tokPerS, 0),
          frontend_tok_per_s: round(f.tokPerS, 0),
          frontend_cpu_us_per_token: !viaFrontend(f.path) || f.frontendCpuUsPerToken === undefined ? null : round(f.frontendCpuUsPerToken, 2),
        }));
    });
    if (ratios.length > 0) {
      console.log('');
      console.log(
        table(
          ['conc', 'path', 'ttft p50 x', 'tok/s /direct', 'req/s /direct', '+ttft p50 ms', '+ttft p99 ms', '+total p50 ms', '+total p99 ms'],
          ratios.map((r) => [
            String(r.concurrency),
            r.path,
            fmt(r.ttft_p50_ratio ?? NaN, 2),
            fmt(r.tok_per_s_ratio ?? NaN, 3),
            fmt(r.req_per_s_ratio ?? NaN, 3),
            fmt(r.added_ttft_ms_p50 ?? NaN, 2),
            fmt(r.added_ttft_ms_p99 ?? NaN, 2),
            fmt(r.added_total_ms_p50 ?? NaN, 2),
            fmt(r.added_total_ms_p99 ?? NaN, 2),
          ]),
        ),
      );
    }
    // Peak resident set over the whole run (what a container's memory limit must hold).
    const mib = (b: number | undefined) => (b === undefined ? null : round(b / 2 ** 20, 0));
    const peakRss = { frontend: mib(procPeakRssBytes(pids.frontend)), worker: mib(procPeakRssBytes(pids.worker)) };
    console.log('');
    console.log(`peak RSS (VmHWM) over the run: frontend ${peakRss.frontend ?? '-'} MiB, worker ${peakRss.worker ?? '-'} MiB`);
    const errors = stats.reduce((n, s) => n + s.errors, 0);
    const maxOther = Math.max(0, ...stats.map((s) => s.cpuPct.other ?? 0));
    if (maxOther >= 15) {
      console.log('');
      console.log(`WARNING: other processes on this machine used up to ${fmt(maxOther, 0)}% CPU during measurement (see "cpu% other"); those points understate both paths.`);
    }
    console.log('');
    console.log(
      JSON.stringify({
        bench: 'frontend-overhead',
        cores,
        shared_cores_note: 'load generator, frontend and worker share these cores',
        node: process.version,
        max_tokens: opts.maxTokens,
        duration_ms: opts.durationMs,
        warmup_ms: opts.warmupMs,
        rounds: opts.rounds,
        client_parse: opts.jsonParse ? 'json' : 'scan',
        errors,
        max_other_cpu_pct: round(maxOther, 0),
        peak_rss_mib: peakRss,
        ratios,
        points: stats.map((s) => ({
          concurrency: s.concurrency,
          path: s.path,
          requests: s.requests,
          errors: s.errors,
          tok_per_s: round(s.tokPerS, 0),
          req_per_s: round(s.reqPerS, 1),
          ttft_ms_p50: round(s.ttftP50, 3),
          ttft_ms_p99: round(s.ttftP99, 3),
          total_ms_p50: round(s.totalP50, 3),
          total_ms_p99: round(s.totalP99, 3),
          cpu_pct: {
            client: s.cpuPct.client === undefined ? null : round(s.cpuPct.client, 0),
            frontend: s.cpuPct.frontend === undefined ? null : round(s.cpuPct.frontend, 0),
            worker: s.cpuPct.worker === undefined ? null : round(s.cpuPct.worker, 0),
            other: s.cpuPct.other === undefined ? null : round(s.cpuPct.other, 0),
          },
          limit: limitOf(s, cores),
          frontend_cpu_us_per_token: viaFrontend(s.path) && s.frontendCpuUsPerToken !== undefined ? round(s.frontendCpuUsPerToken, 2) : null,
          worker_cpu_us_per_token: s.workerCpuUsPerToken === undefined ? null : round(s.workerCpuUsPerToken, 2),
        })),
      }),
    );
    if (errors > 0) process.exitCode = 1;
  } finally {
    await agent.destroy().catch(() => undefined);
    // Frontend first (graceful, so a --cpu-prof profile is written), then the worker.
    stopping = true;
    await frontend?.terminate().catch(() => undefined);
    await limited?.terminate().catch(() => undefined);
    await worker?.terminate().catch(() => undefined);
    await redis?.stop().catch(() => undefined);
    killAllNow();
    rmSync(dir, { recursive: true, force: true });
    clearTimeout(watchdog);
  }
}

main().catch((err: unknown) => {
  console.error(`bench failed: ${err instanceof UsageError ? err.message : ((err as Error)?.stack ?? String(err))}`);
  killAllNow();
  process.exit(1);
});
