/**
 * Scale benchmark (issue 12), four parts, each optional (`--parts routing,heartbeats,etcd,streams`):
 *
 * - routing: in process, the cost of one routing decision (pick + acquire + release) with
 *   `--workers` registered (default 10,000).
 * - heartbeats: `--heartbeat-workers` records (default 1,000) in a file discovery directory, each
 *   rewritten once a second by this process (TTL 3 s), and one idle frontend watching it: its CPU
 *   over `--idle-ms`.
 * - etcd: `--etcd-workers` records (default 10,000) in a real etcd (needs etcd installed, else skipped)
 *   and one idle frontend watching them: its CPU over `--idle-ms`, then its CPU per change for
 *   `--etcd-changes` re-registrations (default 2,000).
 * - streams: `--streams` concurrent slow streams (default 2,000; 10,000 needs `ulimit -n` above
 *   ~20,100 for the frontend's two sockets per stream), each on a new connection, first straight to
 *   one mocker worker and then through one frontend (ITL `--itl-ms` 1000, `--stream-tokens` 30):
 *   TTFT p50/p99 of both, whether every stream reached the worker (its in-flight count), the
 *   frontend's peak RSS and its event-loop delay during the burst (p99 and max, from /metrics).
 *
 *   npx tsc -p . && node dist/bench/scale.js [--parts ...] [--ebb-cli other/dist/bin/ebb.js]
 *     [--frontend-node-args "--cpu-prof --cpu-prof-dir=/tmp/prof"]
 */
import { spawn } from 'node:child_process';
import { readFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { Agent, request } from 'undici';
import { Etcd3 } from 'etcd3';
import { etcdKey } from '../src/discovery/etcd-keys.js';
import { FileDiscovery } from '../src/discovery/file.js';
import { etcdSkipReason, startEtcd } from '../test/helpers/etcd.js';
import { CLI, EbbProcess, killAllNow, metricValue, metricValues, startWorker } from '../test/helpers/processes.js';
import { arg } from './cli-arg.js';
import { procCpuMs } from './proc-cpu.js';
import { routingCost } from './routing.js';

const parts = arg('parts', 'routing,heartbeats,etcd,streams').split(',');
const ebbCli = resolve(arg('ebb-cli', CLI));
const frontendNodeArgs = arg('frontend-node-args', '').split(' ').filter(Boolean);
process.on('exit', killAllNow);
setTimeout(() => {
  console.error('scale: watchdog, giving up');
  process.exit(2);
}, 600_000).unref();

function cpuMs(pid: number): number {
  const ms = procCpuMs(pid);
  if (ms === undefined) throw new Error(`no /proc/${pid}/stat: this benchmark reads Linux's /proc`);
  return ms;
}
function rssMb(pid: number): number {
  const m = /VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : NaN;
}
const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))] ?? NaN;
};

function startFrontend(discovery: string): { fe: EbbProcess; ready: Promise<string> } {
  const fe = new EbbProcess(
    spawn(process.execPath, [...frontendNodeArgs, ebbCli, 'frontend', '--port', '0', '--discovery', discovery, '--max-connections', '1000000'], { env: { ...process.env, EBB_LOG_LEVEL: 'info' }, stdio: ['ignore', 'pipe', 'pipe'] }),
    'frontend',
  );
  return { fe, ready: fe.waitForEvent('frontend_ready').then((l) => l.url as string) };
}

const out: Record<string, unknown> = { bench: 'scale', ebb_cli: ebbCli };
const TOKEN = /"delta":\{"content":"[^"]/;

if (parts.includes('routing')) {
  const workers = Number(arg('workers', '10000'));
  const r = await routingCost(workers, 200_000);
  console.log(`routing: ${workers} workers, ${(r.ns_per_decision / 1000).toFixed(3)} µs per decision (pick + acquire + release)`);
  out.routing = r;
}

if (parts.includes('heartbeats')) {
  const n = Number(arg('heartbeat-workers', '1000'));
  const idleMs = Number(arg('idle-ms', '5000'));
  const dir = mkdtempSync(join(tmpdir(), 'ebb-scale-hb-'));
  const registrar = new FileDiscovery(dir, 3000);
  for (let i = 0; i < n; i++) await registrar.register({ worker_id: `w-${i}`, model: 'm', mode: 'aggregated', request_url: `http://127.0.0.1:${10_000 + (i % 50_000)}`, system_url: 'http://127.0.0.1:9' });
  const { fe } = startFrontend(`file://${dir}`);
  await fe.waitForEvent('frontend_ready');
  await new Promise((r) => setTimeout(r, 1500)); // past the initial read
  const self0 = process.cpuUsage();
  const c0 = cpuMs(fe.proc.pid!);
  const t0 = performance.now();
  await new Promise((r) => setTimeout(r, idleMs));
  const pctCpu = ((cpuMs(fe.proc.pid!) - c0) / (performance.now() - t0)) * 100;
  const self = process.cpuUsage(self0);
  console.log(`heartbeats: ${n} workers beating once a second; idle frontend ${pctCpu.toFixed(1)}% CPU over ${idleMs} ms (the writer, this process: ${(((self.user + self.system) / 1000 / idleMs) * 100).toFixed(0)}%)`);
  out.heartbeats = { workers: n, idle_ms: idleMs, frontend_cpu_pct: +pctCpu.toFixed(2) };
  await fe.terminate(); // graceful, so a --cpu-prof profile gets written
  await registrar.close();
}

if (parts.includes('etcd')) {
  // etcd discovery at fleet size: heartbeats are lease keepalives between each worker and etcd, so
  // an idle frontend's watch carries nothing; a change costs the frontend one event, applied in place.
  const skip = etcdSkipReason();
  if (skip) console.log(`etcd: skipped (${skip})`);
  else {
    const n = Number(arg('etcd-workers', '10000'));
    const idleMs = Number(arg('idle-ms', '5000'));
    const changes = Number(arg('etcd-changes', '2000'));
    const etcd = await startEtcd();
    const raw = new Etcd3({ hosts: [etcd.endpoint] });
    // One lease for the bench's keys: what the frontend watches is the same as with one per worker.
    const lease = raw.lease(10);
    // A re-registration moves the worker's request port (gen), as a restarted worker's would.
    const rec = (i: number, gen: number) => ({ worker_id: `w-${i}`, model: `m${i % 10}`, mode: 'aggregated', request_url: `http://127.0.0.1:${10_000 + ((i + gen) % 50_000)}`, system_url: 'http://127.0.0.1:9' });
    /** Puts the records of workers 0..count-1 (modulo n) at `gen`, a few hundred writes in flight at a time. */
    const putRecords = async (count: number, gen: number) => {
      for (let i = 0; i < count; i += 500) {
        await Promise.all(
          Array.from({ length: Math.min(500, count - i) }, (_, k) => {
            const r = rec((i + k) % n, gen);
            return lease.put(etcdKey(r as never)).value(JSON.stringify(r));
          }),
        );
      }
    };
    await putRecords(n, 0);
    const { fe } = startFrontend(etcd.url);
    await fe.waitForLog((l) => l.event === 'discovery_reset' && (l.workers as string[]).length === n, `the ${n} workers in the routing view`);
    await new Promise((r) => setTimeout(r, 1500)); // past the initial list
    const c0 = cpuMs(fe.proc.pid!);
    const t0 = performance.now();
    await new Promise((r) => setTimeout(r, idleMs));
    const idlePct = ((cpuMs(fe.proc.pid!) - c0) / (performance.now() - t0)) * 100;
    // Changes: re-registrations of existing workers on a new port, as a rollout makes them.
    const c1 = cpuMs(fe.proc.pid!);
    let seen = 0;
    const all = fe.waitForLog((l) => l.event === 'worker_added' && ++seen === changes, `${changes} changes applied`, { after: fe.mark() });
    await putRecords(changes, 1);
    await all;
    const perChangeUs = ((cpuMs(fe.proc.pid!) - c1) * 1000) / changes;
    console.log(`etcd: ${n} workers registered; idle frontend ${idlePct.toFixed(1)}% CPU over ${idleMs} ms; ${changes} changes at ${perChangeUs.toFixed(0)} µs of frontend CPU each (log line included)`);
    out.etcd = { workers: n, idle_ms: idleMs, frontend_idle_cpu_pct: +idlePct.toFixed(2), changes, frontend_us_per_change: Math.round(perChangeUs) };
    await fe.terminate();
    await lease.revoke().catch(() => undefined);
    raw.close();
    await etcd.stop();
  }
}

/** What one burst of N streams opened at once measured. */
interface Burst {
  ttft: number[];
  ok: number;
  errors: number;
  firstError: string | undefined;
  /** The worker's in-flight count once every stream had its first token (or had failed). */
  inflightAllStarted: number;
  wallMs: number;
}

/**
 * Opens `n` streams at once (each on its own new connection) and reads them to the end. `isToken`
 * says whether a read holds the first non-empty token.
 */
async function burst(n: number, url: string, body: string, isToken: (chunk: string) => boolean, workerSystemUrl: string): Promise<Burst> {
  const agent = new Agent({ connections: null, pipelining: 1, keepAliveTimeout: 60_000 });
  const r: Burst = { ttft: [], ok: 0, errors: 0, firstError: undefined, inflightAllStarted: 0, wallMs: 0 };
  let allStarted!: () => void;
  const started = new Promise<void>((resolveStarted) => (allStarted = resolveStarted));
  // Each stream counts once: at its first token, or when it fails before one.
  let startedOrFailed = 0;
  const startedOne = () => {
    if (++startedOrFailed === n) allStarted();
  };
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: n }, async () => {
      const s = performance.now();
      let first = true;
      try {
        const res = await request(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body, dispatcher: agent });
        let tail = '';
        for await (const chunk of res.body as AsyncIterable<Buffer>) {
          const text = chunk.toString('latin1');
          tail = (tail + text).slice(-300);
          if (first && isToken(text)) {
            first = false;
            r.ttft.push(performance.now() - s);
            startedOne();
          }
        }
        if (res.statusCode === 200 && !first) r.ok++;
        else throw new Error(`HTTP ${res.statusCode}, body ending ${JSON.stringify(tail)}`);
      } catch (err) {
        r.errors++;
        r.firstError ??= (err as Error).message;
        if (first) startedOne();
      }
    }).concat([
      started.then(async () => {
        r.inflightAllStarted = await metricValue(workerSystemUrl, 'ebb_worker_inflight_requests');
      }),
    ]),
  );
  r.wallMs = performance.now() - t0;
  await agent.close();
  return r;
}

if (parts.includes('streams')) {
  const n = Number(arg('streams', '2000'));
  const itl = Number(arg('itl-ms', '1000'));
  // Streams outlive the burst that opens them, so the worker's in-flight count sees them all at once.
  const tokens = Number(arg('stream-tokens', '30'));
  const discovery = `file://${mkdtempSync(join(tmpdir(), 'ebb-scale-st-'))}`;
  const worker = await startWorker(['--model', 'm', '--discovery', discovery, '--mocker-ttft-ms', '0', '--mocker-itl-ms', String(itl), '--mocker-batch-slots', String(n + 100)]);
  // The same burst straight to the worker first: the mocker's own first-token time (up to one ITL) is the baseline.
  const direct = await burst(n, `${worker.requestUrl}/generate`, JSON.stringify({ model: 'm', prompt: 'user: hi', max_tokens: tokens, stream: true }), (t) => t.includes('{"text":'), worker.systemUrl);
  const { fe, ready } = startFrontend(discovery);
  const url = await ready;
  await fe.waitForLog((l) => (l.event === 'discovery_reset' && (l.workers as string[]).includes(worker.workerId)) || (l.event === 'worker_added' && l.worker_id === worker.workerId), 'the worker');
  let peakRss = 0;
  const rssTimer = setInterval(() => (peakRss = Math.max(peakRss, rssMb(fe.proc.pid!))), 200); // no event says "RSS grew": sample it
  await metricValues(url, ['nodejs_eventloop_lag_p99_seconds']); // a scrape resets the event-loop histogram: it starts with the burst
  const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }], max_tokens: tokens, stream: true });
  // The opening ("content":"") may share a read with the first token: look for a non-empty one.
  const b = await burst(n, `${url}/v1/chat/completions`, body, (t) => TOKEN.test(t), worker.systemUrl);
  clearInterval(rssTimer);
  const [lagP99 = NaN, lagMax = NaN] = await metricValues(url, ['nodejs_eventloop_lag_p99_seconds', 'nodejs_eventloop_lag_max_seconds']);
  const ms = (v: number) => +v.toFixed(1);
  const r = {
    streams: n,
    itl_ms: itl,
    tokens_per_stream: tokens,
    completed: b.ok,
    errors: b.errors,
    ...(b.firstError ? { first_error: b.firstError } : {}),
    worker_inflight_when_all_started: b.inflightAllStarted,
    ttft_ms_p50: ms(pct(b.ttft, 50)),
    ttft_ms_p99: ms(pct(b.ttft, 99)),
    direct_ttft_ms_p50: ms(pct(direct.ttft, 50)),
    direct_ttft_ms_p99: ms(pct(direct.ttft, 99)),
    direct_errors: direct.errors,
    frontend_peak_rss_mb: +peakRss.toFixed(0),
    eventloop_lag_ms_p99: ms(lagP99 * 1000),
    eventloop_lag_ms_max: ms(lagMax * 1000),
    wall_ms: Math.round(b.wallMs),
  };
  console.log(
    `streams: ${n} concurrent (${tokens} tokens at ${itl} ms ITL), each on a new connection: ${b.ok} completed, ${b.errors} errors${b.firstError ? ` (${b.firstError})` : ''}; worker in-flight once all had a token: ${b.inflightAllStarted}; TTFT p50 ${r.ttft_ms_p50} ms, p99 ${r.ttft_ms_p99} ms (direct to the worker: ${r.direct_ttft_ms_p50} / ${r.direct_ttft_ms_p99} ms, ${direct.errors} errors); frontend peak RSS ${r.frontend_peak_rss_mb} MB; event-loop delay p99 ${r.eventloop_lag_ms_p99} ms, max ${r.eventloop_lag_ms_max} ms during the burst`,
  );
  out.streams = r;
  await fe.terminate(); // graceful, so a --cpu-prof profile gets written
  await worker.stop();
}
console.log(JSON.stringify(out));
process.exit(0);
