/**
 * Peer benchmark (issue 12): the same streaming load over the same mocker worker, four ways:
 * direct (POST /generate, NDJSON), through ebb's frontend (POST /v1/chat/completions, SSE), through
 * nginx (proxy_buffering off) and through HAProxy (both relaying /generate as it is). Each proxy
 * gets one core's worth of process (nginx: one worker, no master; HAProxy: nbthread 1; ebb: node).
 * The order of the paths rotates over rounds. For each path it prints tokens/s as a ratio of
 * direct, added TTFT p50/p99, and the proxy process's CPU per relayed token (user and system, from
 * /proc/<pid>/stat), then one JSON line. It installs nothing: a proxy that is not installed is
 * skipped, and the output says so.
 *
 *   npx tsc -p . && node dist/bench/peer-proxies.js [--concurrency 1,16,64,256] [--rounds 2]
 *     [--duration-ms 2000] [--warmup-ms 500] [--max-tokens 64] [--itl-ms 0] [--paths direct,ebb,nginx,haproxy]
 *     [--ebb-cli dist/bin/ebb.js] [--frontend-node-args "--cpu-prof ..."]
 *
 * `--ebb-cli` runs the frontend from another build (another checkout's dist/bin/ebb.js), so
 * two builds can be compared on one machine; the worker always comes from this build.
 * ebb's paths: `ebb` (the defaults: kv router, admission queue, memory stream store, plain
 * streams), `ebb-min` (minimal: `--stream-store none --queue-timeout 0 --router least-loaded`),
 * `ebb-nostore` (the defaults with `--stream-store none`: what a plain stream should cost),
 * `ebb-kept` (the defaults, every request asking to be resumable: `x-ebb-resumable: 1`, its stream
 * kept in memory), `ebb-kept-few` (the same, holding 100 ended streams, not 10,000: what holding
 * them costs), `ebb-redis` (the same, kept in a redis-server started here). Any of them with
 * `@base` (`ebb-kept@base`) runs from `--base-cli <main.js>`, in the same rounds (rotating with the
 * others), for a before/after under the same machine load; `--base-cli` alone adds `ebb@base`
 * (also spelled `ebb-base`).
 * `--stream false` sends small non-streamed requests instead (the worker's and ebb's JSON answers),
 * and reports total latency (added p50/p99) in place of TTFT.
 * `--rates 250,500,1000,...` adds an open-loop section (bench/open-loop.ts: requests arrive at a set
 * rate whatever the answers do): first a rate step on plain `ebb` alone, for the highest rate one
 * frontend process sustains (every request answered, none still waiting when its step ends, the
 * frontend's CPU under one core); then every path at that rate, in rotating rounds, with latency
 * p50/p99 (TTFT streamed, the whole answer with `--stream false`) added to direct's and nginx's.
 * `--concurrency none` skips the closed-loop table.
 * The path `node-pipe` (not in the default set) is a Node TCP pipe (bench/node-pipe-proxy.ts): no
 * HTTP at all, so its CPU per token is the floor of Node's socket layer, below which no Node
 * frontend can go.
 * The path `ebb-2` (not in the default set) is ebb's frontend with `--processes 2` (one port, two
 * relaying processes); its CPU is the primary's and both children's. `--upstream fake` replaces the
 * mocker worker with bench/fake-upstream.ts (a whole answer in one write, nothing per token), so the
 * worker's CPU is out of the way and the frontend is the bottleneck.
 */
import { spawn } from 'node:child_process';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, connect } from 'node:net';
import { cpus, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { Agent, request } from 'undici';
import { CLI, EbbProcess, killAllNow, startWorker, tempDiscoveryUrl } from '../test/helpers/processes.js';
import { injectRecord } from '../test/helpers/http.js';
import { startRedis } from '../test/helpers/redis.js';
import { arg } from './cli-arg.js';
import { openLoop, type Sample as OpenSample } from './open-loop.js';
import { CLOCK_TICKS } from './proc-cpu.js';

/** direct, a pass-through proxy, or one of ebb's variants (EBB_VARIANTS), `@base` for --base-cli's build. */
type Path = string;
const ALL: Path[] = ['direct', 'ebb', 'ebb-min', 'nginx', 'haproxy'];
/** ebb's frontend variants: extra frontend flags, and whether each request asks to be resumable. */
const EBB_VARIANTS: Record<string, { args: string[]; resumable?: boolean; redis?: boolean }> = {
  ebb: { args: [] },
  'ebb-min': { args: ['--stream-store', 'none', '--queue-timeout', '0', '--router', 'least-loaded'] },
  // The defaults but no stream store: a plain stream should cost what it costs here (it is not kept).
  'ebb-nostore': { args: ['--stream-store', 'none'] },
  'ebb-kept': { args: [], resumable: true },
  // Kept, with few ended streams held (100, not the default 10,000): what holding them costs.
  'ebb-kept-few': { args: ['--stream-store-max-streams', '100'], resumable: true },
  'ebb-redis': { args: [], resumable: true, redis: true },
  'ebb-2': { args: ['--processes', '2'] },
};
const variantOf = (p: Path) => EBB_VARIANTS[p.replace(/@base$/, '')];
const MODEL = 'm1';
const NGINX = '/usr/sbin/nginx';
const HAPROXY = '/usr/sbin/haproxy';

const opts = {
  concurrency: arg('concurrency', '1,16,64,256') === 'none' ? [] : arg('concurrency', '1,16,64,256').split(',').map(Number),
  rates: arg('rates', '').split(',').filter(Boolean).map(Number),
  rounds: Number(arg('rounds', '2')),
  durationMs: Number(arg('duration-ms', '2000')),
  warmupMs: Number(arg('warmup-ms', '500')),
  maxTokens: Number(arg('max-tokens', '64')),
  itlMs: Number(arg('itl-ms', '0')),
  paths: arg('paths', ALL.join(',')).split(',') as Path[],
  ebbCli: resolve(arg('ebb-cli', CLI)),
  frontendNodeArgs: arg('frontend-node-args', '').split(' ').filter(Boolean),
  baseCli: arg('base-cli', ''),
  upstream: arg('upstream', 'mocker') as 'mocker' | 'fake',
  stream: arg('stream', 'true') !== 'false',
};
opts.paths = opts.paths.map((p) => (p === 'ebb-base' ? 'ebb@base' : p));
if (opts.baseCli !== '' && !opts.paths.some((p) => p.endsWith('@base'))) opts.paths.push('ebb@base');
for (const p of opts.paths)
  if (!['direct', 'nginx', 'haproxy', 'node-pipe'].includes(p) && variantOf(p) === undefined) throw new Error(`unknown path ${p}`);
if (opts.paths.some((p) => p.endsWith('@base')) && opts.baseCli === '') throw new Error('an @base path needs --base-cli');

const temp = mkdtempSync(join(tmpdir(), 'ebb-peer-'));
const children: Array<{ kill: () => void }> = [];
const cleanup = () => {
  for (const c of children) c.kill();
  killAllNow();
  rmSync(temp, { recursive: true, force: true });
};
process.on('exit', cleanup);
for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => process.exit(130));
// A watchdog: the run always ends.
const budgetMs = 120_000 + (opts.concurrency.length * opts.rounds * opts.paths.length + 2 * opts.rates.length + opts.rounds * opts.paths.length) * (opts.durationMs + opts.warmupMs + 3000);
setTimeout(() => {
  console.error(`peer-proxies: still running after ${budgetMs} ms; giving up`);
  process.exit(2);
}, budgetMs).unref();

function statOf(pid: number | string): string[] | undefined {
  try {
    const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return s.slice(s.lastIndexOf(')') + 2).split(' ');
  } catch {
    return undefined;
  }
}

/** utime and stime in µs of a process (all its threads) and its live children (ebb --processes N). */
function cpuOf(pid: number): { user: number; sys: number } | undefined {
  const f = statOf(pid);
  if (!f) return undefined;
  let user = Number(f[11]);
  let sys = Number(f[12]);
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const c = statOf(entry);
    if (c && Number(c[1]) === pid) {
      user += Number(c[11]);
      sys += Number(c[12]);
    }
  }
  return { user: (user * 1e6) / CLOCK_TICKS, sys: (sys * 1e6) / CLOCK_TICKS };
}

function machineBusy(): { busy: number; total: number } {
  const f = (readFileSync('/proc/stat', 'utf8').split('\n', 1)[0] as string).trim().split(/\s+/).slice(1).map(Number);
  const total = f.reduce((a, b) => a + b, 0);
  return { busy: total - (f[3] ?? 0) - (f[4] ?? 0), total };
}

async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as { port: number }).port;
  await new Promise<void>((r) => srv.close(() => r()));
  return port;
}

/** A foreign process says nothing when it listens: try to connect until it accepts (bounded). */
async function waitListening(port: number, what: string, child: { exited: boolean; err: () => string }): Promise<void> {
  for (let i = 0; i < 100; i++) {
    if (child.exited) throw new Error(`${what} exited: ${child.err()}`);
    const ok = await new Promise<boolean>((r) => {
      const s = connect(port, '127.0.0.1');
      s.once('connect', () => (s.destroy(), r(true)));
      s.once('error', () => r(false));
    });
    if (ok) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`${what} did not listen on ${port}`);
}

function startForeign(bin: string, args: string[], what: string) {
  const proc = spawn(bin, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  proc.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  const state = { exited: false, err: () => err };
  proc.once('exit', () => (state.exited = true));
  children.push({ kill: () => proc.kill('SIGKILL') });
  return { proc, state, what };
}

async function startNginx(workerPort: number): Promise<{ url: string; pid: number }> {
  const port = await freePort();
  const dir = join(temp, 'nginx');
  execFileSync('mkdir', ['-p', dir]);
  writeFileSync(
    join(dir, 'nginx.conf'),
    `daemon off; master_process off; worker_processes 1; pid ${dir}/nginx.pid; error_log ${dir}/error.log warn;
worker_rlimit_nofile 19000;
events { worker_connections 9000; }
http {
  access_log off;
  client_body_temp_path ${dir}/body; proxy_temp_path ${dir}/proxy; fastcgi_temp_path ${dir}/fcgi; uwsgi_temp_path ${dir}/uwsgi; scgi_temp_path ${dir}/scgi;
  upstream worker { server 127.0.0.1:${workerPort}; keepalive 1024; }
  server {
    listen 127.0.0.1:${port} backlog=4096;
    keepalive_requests 1000000;
    location / { proxy_pass http://worker; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off; proxy_read_timeout 600s; }
  }
}
`,
  );
  const f = startForeign(NGINX, ['-p', dir, '-e', `${dir}/error.log`, '-c', join(dir, 'nginx.conf')], 'nginx');
  await waitListening(port, 'nginx', f.state);
  return { url: `http://127.0.0.1:${port}`, pid: f.proc.pid! };
}

async function startNodePipe(workerPort: number): Promise<{ url: string; pid: number }> {
  const proc = spawn(process.execPath, [new URL('node-pipe-proxy.js', import.meta.url).pathname, '0', String(workerPort)], { stdio: ['ignore', 'pipe', 'inherit'] });
  children.push({ kill: () => proc.kill('SIGKILL') });
  const port = await new Promise<number>((resolvePort, reject) => {
    proc.once('exit', (code) => reject(new Error(`node-pipe-proxy exited (${code})`)));
    proc.stdout!.once('data', (d: Buffer) => resolvePort(Number(/listening (\d+)/.exec(d.toString())?.[1])));
  });
  return { url: `http://127.0.0.1:${port}`, pid: proc.pid! };
}

async function startHaproxy(workerPort: number): Promise<{ url: string; pid: number }> {
  const port = await freePort();
  const cfg = join(temp, 'haproxy.cfg');
  writeFileSync(
    cfg,
    `global
  nbthread 1
  maxconn 9000
defaults
  mode http
  timeout connect 5s
  timeout client 600s
  timeout server 600s
  option http-keep-alive
frontend f
  bind 127.0.0.1:${port}
  default_backend b
backend b
  http-reuse always
  server w 127.0.0.1:${workerPort}
`,
  );
  const f = startForeign(HAPROXY, ['-f', cfg, '-db'], 'haproxy');
  await waitListening(port, 'haproxy', f.state);
  return { url: `http://127.0.0.1:${port}`, pid: f.proc.pid! };
}

/** The proxies that relay /generate as it is, each started in front of the worker's port. */
const PASS_THROUGH: Partial<Record<Path, (workerPort: number) => Promise<{ url: string; pid: number }>>> = { nginx: startNginx, haproxy: startHaproxy, 'node-pipe': startNodePipe };

/** bench/fake-upstream.ts as the worker, put into file discovery by hand (it has no lifecycle of its own). */
async function startFake(discovery: string): Promise<{ workerId: string; requestUrl: string; stop: () => Promise<void> }> {
  const proc = spawn(process.execPath, [new URL('fake-upstream.js', import.meta.url).pathname, '0'], { stdio: ['ignore', 'pipe', 'inherit'] });
  children.push({ kill: () => proc.kill('SIGKILL') });
  const port = await new Promise<number>((resolvePort, reject) => {
    proc.once('exit', (code) => reject(new Error(`fake-upstream exited (${code})`)));
    proc.stdout!.once('data', (d: Buffer) => resolvePort(Number(/listening (\d+)/.exec(d.toString())?.[1])));
  });
  const url = `http://127.0.0.1:${port}`;
  injectRecord(discovery, { worker_id: 'fake-upstream', model: MODEL, request_url: url, system_url: url, engine: 'fake' });
  return { workerId: 'fake-upstream', requestUrl: url, stop: async () => void proc.kill('SIGKILL') };
}

// --- load ---

interface Target {
  path: Path;
  url: string;
  body: string;
  /** A token's mark in the body, and the body's last mark (the stream's end). */
  tokenMark: string;
  endMark: string;
  pid?: number | undefined;
  headers: Record<string, string>;
}

interface Sample {
  ttft: number;
  tokens: number;
}

/** Counts token marks in a streamed body without building lines (the client shares the cores). */
async function one(agent: Agent, t: Target): Promise<Sample> {
  const started = performance.now();
  const res = await request(t.url, { method: 'POST', headers: t.headers, body: t.body, dispatcher: agent });
  if (res.statusCode !== 200) throw new Error(`${t.path}: HTTP ${res.statusCode}: ${(await res.body.text()).slice(0, 200)}`);
  if (!opts.stream) {
    // A whole answer: its latency stands in the TTFT column, and its usage says how many tokens it had.
    const text = await res.body.text();
    if (!text.includes(`"completion_tokens":${opts.maxTokens}`)) throw new Error(`${t.path}: an answer without ${opts.maxTokens} completion tokens: ${text.slice(0, 200)}`);
    return { ttft: performance.now() - started, tokens: opts.maxTokens };
  }
  let tokens = 0;
  let ttft = -1;
  let carry = '';
  let ended = false;
  for await (const chunk of res.body as AsyncIterable<Buffer>) {
    const text = carry + chunk.toString('latin1');
    for (let i = text.indexOf(t.tokenMark); i >= 0; i = text.indexOf(t.tokenMark, i + 1)) {
      if (tokens++ === 0) ttft = performance.now() - started;
    }
    if (text.includes(t.endMark)) ended = true;
    const keep = Math.max(t.tokenMark.length, t.endMark.length) - 1;
    carry = text.slice(-keep);
    // A mark wholly inside the carry was counted already: drop it from the next scan.
    if (carry.includes(t.tokenMark)) carry = carry.slice(carry.lastIndexOf(t.tokenMark) + 1);
  }
  if (!ended) throw new Error(`${t.path}: stream ended without its end mark`);
  if (tokens !== opts.maxTokens) throw new Error(`${t.path}: ${tokens} tokens, expected ${opts.maxTokens}`);
  return { ttft, tokens };
}

interface Point {
  path: Path;
  concurrency: number;
  tokens: number;
  elapsedMs: number;
  ttft: number[];
  errors: number;
  firstError?: string;
  userUs: number | undefined;
  sysUs: number | undefined;
  otherPct: number;
}

async function phase(agent: Agent, t: Target, c: number, ms: number, measure: boolean): Promise<Point> {
  const ttft: number[] = [];
  let tokens = 0;
  let errors = 0;
  let firstError: string | undefined;
  const cpu0 = t.pid ? cpuOf(t.pid) : undefined;
  const m0 = machineBusy();
  const self0 = process.cpuUsage();
  const t0 = performance.now();
  const deadline = t0 + ms;
  await Promise.all(
    Array.from({ length: c }, async () => {
      while (performance.now() < deadline) {
        try {
          const s = await one(agent, t);
          if (measure) ttft.push(s.ttft);
          tokens += s.tokens;
        } catch (err) {
          errors++;
          firstError ??= (err as Error).message;
          if (errors > 50) throw new Error(`too many errors on ${t.path}: ${firstError}`);
        }
      }
    }),
  );
  const elapsedMs = performance.now() - t0;
  const cpu1 = t.pid ? cpuOf(t.pid) : undefined;
  const m1 = machineBusy();
  const self = process.cpuUsage(self0);
  const machineUs = ((m1.busy - m0.busy) * 1e6) / CLOCK_TICKS;
  const proxyUs = cpu0 && cpu1 ? cpu1.user - cpu0.user + cpu1.sys - cpu0.sys : 0;
  // What else ran: the machine's busy time less this client and the proxy (the worker is in it too).
  const otherPct = Math.max(0, ((machineUs - self.user - self.system - proxyUs) / (elapsedMs * 1000)) * 100);
  return {
    path: t.path,
    concurrency: c,
    tokens,
    elapsedMs,
    ttft,
    errors,
    ...(firstError ? { firstError } : {}),
    userUs: cpu0 && cpu1 && tokens > 0 ? (cpu1.user - cpu0.user) / tokens : undefined,
    sysUs: cpu0 && cpu1 && tokens > 0 ? (cpu1.sys - cpu0.sys) / tokens : undefined,
    otherPct,
  };
}

const pct = (xs: number[], p: number) => {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))] as number;
};

function mergePoints(ps: Point[]): Point {
  const a = ps[0] as Point;
  const tokens = ps.reduce((n, p) => n + p.tokens, 0);
  const wavg = (k: 'userUs' | 'sysUs') => (ps.every((p) => p[k] !== undefined) ? ps.reduce((n, p) => n + (p[k] as number) * p.tokens, 0) / Math.max(1, tokens) : undefined);
  return {
    path: a.path,
    concurrency: a.concurrency,
    tokens,
    elapsedMs: ps.reduce((n, p) => n + p.elapsedMs, 0),
    ttft: ps.flatMap((p) => p.ttft),
    errors: ps.reduce((n, p) => n + p.errors, 0),
    userUs: wavg('userUs'),
    sysUs: wavg('sysUs'),
    otherPct: Math.max(...ps.map((p) => p.otherPct)),
  };
}

/** One request of an open loop: its latency (TTFT streamed, the whole answer not), ok or not. */
async function openOne(agent: Agent, t: Target): Promise<OpenSample> {
  const sentAt = performance.now();
  try {
    const s = await one(agent, t);
    return { label: t.path, sentAt, endedAt: performance.now(), ok: true, status: 200, ttftMs: s.ttft, workerId: null };
  } catch (err) {
    return { label: t.path, sentAt, endedAt: performance.now(), ok: false, status: 0, code: (err as Error).message.slice(0, 120), workerId: null };
  }
}

interface OpenPoint {
  path: Path;
  rate: number;
  offered: number;
  answered: number;
  failed: number;
  /** Requests sent in the window still unanswered at its end (the backlog a rate past capacity grows). */
  late: number;
  latency: number[];
  cpuPct: number | undefined;
  otherPct: number;
  firstError?: string | undefined;
}

/** `rate` requests a second on `t` for `ms` (after a warm-up at that rate): what came back within the window, and the proxy's CPU. */
async function openPhase(agent: Agent, t: Target, rate: number, ms: number): Promise<OpenPoint> {
  const warm = openLoop(rate, () => openOne(agent, t));
  await new Promise((r) => setTimeout(r, opts.warmupMs));
  await warm.stop();
  const cpu0 = t.pid ? cpuOf(t.pid) : undefined;
  const m0 = machineBusy();
  const self0 = process.cpuUsage();
  const t0 = performance.now();
  const loop = openLoop(rate, () => openOne(agent, t));
  await new Promise((r) => setTimeout(r, ms));
  const windowEnd = performance.now();
  const cpu1 = t.pid ? cpuOf(t.pid) : undefined;
  const m1 = machineBusy();
  const self = process.cpuUsage(self0);
  const samples = await loop.stop();
  const elapsedUs = (windowEnd - t0) * 1000;
  const proxyUs = cpu0 && cpu1 ? cpu1.user - cpu0.user + cpu1.sys - cpu0.sys : 0;
  const machineUs = ((m1.busy - m0.busy) * 1e6) / CLOCK_TICKS;
  const inWindow = samples.filter((x) => x.endedAt <= windowEnd);
  return {
    path: t.path,
    rate,
    offered: samples.length,
    answered: inWindow.filter((x) => x.ok).length,
    failed: samples.filter((x) => !x.ok).length,
    late: samples.filter((x) => x.endedAt > windowEnd).length,
    latency: inWindow.filter((x) => x.ok).map((x) => x.ttftMs as number),
    cpuPct: cpu0 && cpu1 ? (proxyUs / elapsedUs) * 100 : undefined,
    otherPct: Math.max(0, ((machineUs - self.user - self.system - proxyUs) / elapsedUs) * 100),
    firstError: samples.find((x) => !x.ok)?.code,
  };
}

/**
 * The open-loop section: the rate step on plain ebb (the highest rate it sustains), then every path
 * at that rate in rotating rounds. A rate is sustained when every request was answered, at most 2 %
 * of them (and at most 5) were still open as the window closed (a rate past capacity leaves a growing
 * backlog), and the frontend used less than one core (one process; above that it is saturated).
 */
async function openSection(agent: Agent, targets: Target[]): Promise<void> {
  const ebb = targets.find((t) => t.path === 'ebb');
  if (ebb === undefined) throw new Error('--rates needs the path ebb (its rate step finds the rate)');
  console.log(`\nopen loop: ${opts.stream ? 'streams' : 'non-streamed requests'} of ${opts.maxTokens} tokens at a set rate (bench/open-loop.ts); rate step on ebb, ${opts.durationMs} ms per rate`);
  let sustained: number | undefined;
  steps: for (const rate of opts.rates) {
    // A rate missed once is tried once more (a shared machine's other load comes and goes); missed twice, the step ends.
    for (let attempt = 1; attempt <= 2; attempt++) {
      const p = await openPhase(agent, ebb, rate, opts.durationMs);
      const ok = p.failed === 0 && p.late <= Math.max(5, 0.02 * p.offered) && (p.cpuPct ?? 0) < 100;
      console.log(`  ebb at ${rate}/s: ${p.answered}/${p.offered} answered in the window, ${p.late} open at its end, ${p.failed} failed${p.firstError ? ` (${p.firstError})` : ''}, latency p50 ${pct(p.latency, 50).toFixed(2)} ms p99 ${pct(p.latency, 99).toFixed(2)} ms, frontend cpu ${p.cpuPct?.toFixed(0)}%, other ${p.otherPct.toFixed(0)}%: ${ok ? 'sustained' : 'not sustained'}`);
      if (ok) {
        sustained = rate;
        continue steps;
      }
    }
    break;
  }
  if (sustained === undefined) {
    console.log('  ebb sustained none of the rates: give lower --rates');
    return;
  }
  const byPath = new Map<Path, OpenPoint[]>();
  for (let r = 0; r < opts.rounds; r++) {
    const order = targets.map((_, i) => targets[(i + r) % targets.length] as Target);
    for (const t of order) {
      const p = await openPhase(agent, t, sustained, opts.durationMs);
      byPath.set(t.path, [...(byPath.get(t.path) ?? []), p]);
      console.log(`  ${sustained}/s ${t.path} round ${r + 1}: ${p.answered}/${p.offered} answered, ${p.late} open at the end, ${p.failed} failed, other ${p.otherPct.toFixed(0)}% cpu`);
    }
  }
  const lat = (path: Path) => (byPath.get(path) ?? []).flatMap((p) => p.latency);
  const direct = lat('direct');
  const nginx = lat('nginx');
  const rows = targets.map((t) => {
    const ps = byPath.get(t.path) as OpenPoint[];
    const l = lat(t.path);
    const d = (ref: number[], q: number) => (ref.length === 0 ? null : +(pct(l, q) - pct(ref, q)).toFixed(2));
    const cpus = ps.map((p) => p.cpuPct).filter((c): c is number => c !== undefined);
    return {
      rate: sustained,
      path: t.path,
      answered: ps.reduce((n, p) => n + p.answered, 0),
      offered: ps.reduce((n, p) => n + p.offered, 0),
      late: ps.reduce((n, p) => n + p.late, 0),
      failed: ps.reduce((n, p) => n + p.failed, 0),
      p50_ms: +pct(l, 50).toFixed(2),
      p99_ms: +pct(l, 99).toFixed(2),
      added_p50_ms: d(direct, 50),
      added_p99_ms: d(direct, 99),
      p50_vs_nginx_ms: d(nginx, 50),
      p99_vs_nginx_ms: d(nginx, 99),
      proxy_cpu_pct: cpus.length === 0 ? null : Math.round(cpus.reduce((a, b) => a + b, 0) / cpus.length),
      other_cpu_pct: Math.round(Math.max(...ps.map((p) => p.otherPct))),
    };
  });
  const head = ['rate/s', 'path', 'answered/offered', 'open at end', 'failed', 'p50 ms', 'p99 ms', '+p50 (− direct)', '+p99 (− direct)', 'p50 − nginx', 'p99 − nginx', 'proxy cpu%', 'other cpu%'];
  const fmt = (v: unknown) => (v === null || v === undefined ? '-' : String(v));
  const table = [head, ...rows.map((r) => [r.rate, r.path, `${r.answered}/${r.offered}`, r.late, r.failed, r.p50_ms, r.p99_ms, r.added_p50_ms, r.added_p99_ms, r.p50_vs_nginx_ms, r.p99_vs_nginx_ms, r.proxy_cpu_pct, r.other_cpu_pct].map(fmt))];
  const widths = head.map((_, i) => Math.max(...table.map((r) => (r[i] as string).length)));
  console.log(`\nat ${sustained}/s (the highest rate of --rates one ebb frontend process sustained): latency = ${opts.stream ? 'TTFT' : "a whole answer's"}, in ms; + = path − direct at the same percentile`);
  for (const r of table) console.log(r.map((v, i) => (v as string).padEnd(widths[i] as number)).join('  '));
  console.log(JSON.stringify({ bench: 'peer-proxies-open-loop', cores: cpus().length, node: process.version, max_tokens: opts.maxTokens, stream: opts.stream, rates: opts.rates, sustained, rounds: opts.rounds, duration_ms: opts.durationMs, ebb_cli: opts.ebbCli, base_cli: opts.baseCli || null, rows }));
  if (rows.some((r) => r.failed > 0)) process.exitCode = 1;
}

async function main(): Promise<void> {
  const missing: string[] = [];
  if (opts.paths.includes('nginx') && !existsSync(NGINX)) missing.push(`nginx (${NGINX}; Debian package "nginx")`);
  if (opts.paths.includes('haproxy') && !existsSync(HAPROXY)) missing.push(`haproxy (${HAPROXY}; Debian package "haproxy")`);
  const paths = opts.paths.filter((p) => !(p === 'nginx' && !existsSync(NGINX)) && !(p === 'haproxy' && !existsSync(HAPROXY)));
  if (missing.length > 0) console.log(`NOTE: not installed, skipped: ${missing.join('; ')}`);

  const discovery = tempDiscoveryUrl();
  const slots = Math.max(512, 2 * Math.max(...opts.concurrency));
  const worker = opts.upstream === 'fake' ? await startFake(discovery) : await startWorker(['--model', MODEL, '--discovery', discovery, '--mocker-ttft-ms', '0', '--mocker-itl-ms', String(opts.itlMs), '--mocker-batch-slots', String(slots)]);
  const workerPort = Number(new URL(worker.requestUrl).port);
  const targets: Target[] = [];
  const frontends: EbbProcess[] = [];
  const genBody = JSON.stringify({ model: MODEL, prompt: 'user: tell me about tides', max_tokens: opts.maxTokens, stream: opts.stream });
  const nd = { tokenMark: '{"text":', endMark: '"done":true', headers: { 'content-type': 'application/json' } };
  const redis = paths.some((p) => variantOf(p)?.redis === true) ? await startRedis() : undefined;
  if (redis !== undefined) children.push({ kill: () => void redis.kill() });
  for (const p of paths) {
    if (p === 'direct') targets.push({ path: p, url: `${worker.requestUrl}/generate`, body: genBody, ...nd });
    const startProxy = PASS_THROUGH[p];
    if (startProxy) {
      const proxy = await startProxy(workerPort);
      targets.push({ path: p, url: `${proxy.url}/generate`, body: genBody, ...nd, pid: proxy.pid });
    }
    const variant = variantOf(p);
    if (variant !== undefined) {
      const cli = p.endsWith('@base') ? resolve(opts.baseCli) : opts.ebbCli;
      const store = variant.redis === true ? ['--stream-store', redis!.url] : [];
      const fe = new EbbProcess(
        spawn(process.execPath, [...opts.frontendNodeArgs, cli, 'frontend', '--port', '0', '--discovery', discovery, '--max-connections', '100000', '--shutdown-grace-ms', '0', ...variant.args, ...store], {
          env: { ...process.env, EBB_LOG_LEVEL: 'info' },
          stdio: ['ignore', 'pipe', 'pipe'],
        }),
        'frontend',
      );
      frontends.push(fe);
      const url = (await fe.waitForEvent('frontend_ready')).url as string;
      await fe.waitForLog((l) => (l.event === 'discovery_reset' && (l.workers as string[]).includes(worker.workerId)) || (l.event === 'worker_added' && l.worker_id === worker.workerId), 'the worker in the routing view');
      const body = JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'tell me about tides' }], max_tokens: opts.maxTokens, stream: opts.stream });
      const headers: Record<string, string> = { 'content-type': 'application/json', ...(variant.resumable === true && { 'x-ebb-resumable': '1' }) };
      targets.push({ path: p, url: `${url}/v1/chat/completions`, body, tokenMark: '"delta":{"content":"', endMark: 'data: [DONE]', pid: fe.proc.pid, headers });
    }
  }
  const agent = new Agent({ connections: null, keepAliveTimeout: 30_000, pipelining: 1 });
  for (const t of targets) await one(agent, t); // smoke: every path streams

  console.log(
    `peer proxies: 1 ${opts.upstream === 'fake' ? 'fake upstream (a whole answer per write)' : `mocker worker (itl ${opts.itlMs} ms, ttft 0)`} on loopback; max_tokens ${opts.maxTokens}; ${opts.rounds} round(s) x ${opts.durationMs} ms per point and path (order rotates), ${opts.warmupMs} ms warm-up; ${cpus().length} cores shared by client, worker and proxy; node ${process.version}`,
  );
  const results: Array<{ concurrency: number; points: Point[] }> = [];
  for (const c of opts.concurrency) {
    const byPath = new Map<Path, Point[]>();
    for (let r = 0; r < opts.rounds; r++) {
      const order = targets.map((_, i) => targets[(i + r) % targets.length] as Target);
      for (const t of order) {
        await phase(agent, t, c, opts.warmupMs, false);
        const p = await phase(agent, t, c, opts.durationMs, true);
        byPath.set(t.path, [...(byPath.get(t.path) ?? []), p]);
        console.log(`  c=${c} ${t.path} round ${r + 1}: ${Math.round((p.tokens / p.elapsedMs) * 1000)} tok/s, other ${p.otherPct.toFixed(0)}% cpu${p.errors ? `, ${p.errors} errors (${p.firstError})` : ''}`);
      }
    }
    results.push({ concurrency: c, points: targets.map((t) => mergePoints(byPath.get(t.path) as Point[])) });
  }
  if (opts.rates.length > 0) await openSection(agent, targets);
  await agent.close();

  const cpuOfPoint = (p: Point | undefined) => (p?.userUs === undefined || p.sysUs === undefined ? undefined : p.userUs + p.sysUs);
  const rows = results.flatMap(({ concurrency, points }) => {
    const direct = points.find((p) => p.path === 'direct');
    const nginx = points.find((p) => p.path === 'nginx');
    const plain = points.find((p) => p.path === 'ebb');
    return points.map((p) => {
      const tps = (p.tokens / p.elapsedMs) * 1000;
      const dtps = direct ? (direct.tokens / direct.elapsedMs) * 1000 : NaN;
      const cpu = cpuOfPoint(p);
      const versus = (ref: Point | undefined) => (cpu === undefined || cpuOfPoint(ref) === undefined ? null : +(cpu / cpuOfPoint(ref)!).toFixed(2));
      return {
        concurrency,
        path: p.path,
        tok_per_s: Math.round(tps),
        ratio: direct ? +(tps / dtps).toFixed(3) : null,
        ttft_ms_p50: +pct(p.ttft, 50).toFixed(2),
        ttft_ms_p99: +pct(p.ttft, 99).toFixed(2),
        added_ttft_ms_p50: direct ? +(pct(p.ttft, 50) - pct(direct.ttft, 50)).toFixed(2) : null,
        added_ttft_ms_p99: direct ? +(pct(p.ttft, 99) - pct(direct.ttft, 99)).toFixed(2) : null,
        ttft_p50_vs_nginx_ms: nginx ? +(pct(p.ttft, 50) - pct(nginx.ttft, 50)).toFixed(2) : null,
        user_us_per_token: p.userUs === undefined ? null : +p.userUs.toFixed(2),
        sys_us_per_token: p.sysUs === undefined ? null : +p.sysUs.toFixed(2),
        cpu_us_per_token: cpu === undefined ? null : +cpu.toFixed(2),
        cpu_vs_nginx: versus(nginx),
        cpu_vs_ebb: versus(plain),
        errors: p.errors,
        other_cpu_pct: Math.round(p.otherPct),
      };
    });
  });
  const lat = opts.stream ? 'ttft' : 'total';
  const head = ['conc', 'path', 'tok/s', 'ratio', `${lat} p50`, `${lat} p99`, `+${lat} p50`, `+${lat} p99`, `${lat} p50 - nginx`, 'user µs/tok', 'sys µs/tok', 'cpu µs/tok', 'cpu ÷ nginx', 'cpu ÷ ebb', 'errors', 'other cpu%'];
  const fmt = (v: unknown) => (v === null || v === undefined ? '-' : String(v));
  const table = [
    head,
    ...rows.map((r) =>
      [r.concurrency, r.path, r.tok_per_s, r.ratio, r.ttft_ms_p50, r.ttft_ms_p99, r.added_ttft_ms_p50, r.added_ttft_ms_p99, r.ttft_p50_vs_nginx_ms, r.user_us_per_token, r.sys_us_per_token, r.cpu_us_per_token, r.cpu_vs_nginx, r.cpu_vs_ebb, r.errors, r.other_cpu_pct].map(fmt),
    ),
  ];
  if (rows.length > 0) {
    const widths = head.map((_, i) => Math.max(...table.map((r) => (r[i] as string).length)));
    console.log(
      `\nratio = tok/s ÷ direct in the same rounds; +${lat} = path − direct (ms); µs/tok = the proxy process's CPU per relayed token (ebb: the frontend), user + system in cpu; ÷ nginx, ÷ ebb (ebb with its defaults, plain streams): that CPU per token as a ratio${opts.stream ? '' : `; ${lat} = a whole non-streamed answer's latency`}`,
    );
    for (const r of table) console.log(r.map((v, i) => (v as string).padEnd(widths[i] as number)).join('  '));
    const maxOther = Math.max(...rows.map((r) => r.other_cpu_pct));
    if (maxOther >= 15) console.log(`WARNING: other processes used up to ${maxOther}% CPU during measurement (the worker's own share is in it too).`);
    console.log(JSON.stringify({ bench: 'peer-proxies', cores: cpus().length, node: process.version, max_tokens: opts.maxTokens, itl_ms: opts.itlMs, rounds: opts.rounds, duration_ms: opts.durationMs, ebb_cli: opts.ebbCli, base_cli: opts.baseCli || null, stream: opts.stream, skipped: missing, rows }));
  }
  for (const fe of frontends) await fe.terminate(); // a graceful stop, so --cpu-prof writes its profile
  await worker.stop();
  process.exit(rows.some((r) => r.errors > 0) || process.exitCode === 1 ? 1 : 0);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
