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
 *   ~25,000 for the frontend's two sockets per stream) through one frontend to one mocker worker
 *   (ITL `--itl-ms` 200, `--stream-tokens` 5): TTFT p50/p99, whether every stream reached the worker
 *   (its in-flight count), the frontend's peak RSS and its event-loop delay (p99, from /metrics).
 *
 *   npx tsc -p . && node dist/bench/scale.js [--parts ...] [--ebb-cli other/dist/src/cli/main.js]
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
import { CLI, EbbProcess, killAllNow, metricValue, startWorker } from '../test/helpers/processes.js';
import { routingCost } from './routing.js';

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? (process.argv[i + 1] as string) : dflt;
}
const parts = arg('parts', 'routing,heartbeats,etcd,streams').split(',');
const ebbCli = resolve(arg('ebb-cli', CLI));
const frontendNodeArgs = arg('frontend-node-args', '').split(' ').filter(Boolean);
process.on('exit', killAllNow);
setTimeout(() => {
  console.error('scale: watchdog, giving up');
  process.exit(2);
}, 600_000).unref();

const clk = 100; // Linux USER_HZ
function cpuMs(pid: number): number {
  const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
  return ((Number(f[11]) + Number(f[12])) * 1000) / clk;
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

if (parts.includes('streams')) {
  const n = Number(arg('streams', '2000'));
  const itl = Number(arg('itl-ms', '200'));
  const tokens = Number(arg('stream-tokens', '5'));
  const discovery = `file://${mkdtempSync(join(tmpdir(), 'ebb-scale-st-'))}`;
  const worker = await startWorker(['--model', 'm', '--discovery', discovery, '--mocker-ttft-ms', '0', '--mocker-itl-ms', String(itl), '--mocker-batch-slots', String(n + 100)]);
  const { fe, ready } = startFrontend(discovery);
  const url = await ready;
  await fe.waitForLog((l) => (l.event === 'discovery_reset' && (l.workers as string[]).includes(worker.workerId)) || (l.event === 'worker_added' && l.worker_id === worker.workerId), 'the worker');
  const agent = new Agent({ connections: null, pipelining: 1, keepAliveTimeout: 60_000 });
  const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'hi' }], max_tokens: tokens, stream: true });
  const ttft: number[] = [];
  let ok = 0;
  let errors = 0;
  let firstError: string | undefined;
  let peakRss = 0;
  let peakInflight = 0;
  let allStarted!: () => void;
  const started = new Promise<void>((r) => (allStarted = r));
  const rssTimer = setInterval(() => (peakRss = Math.max(peakRss, rssMb(fe.proc.pid!))), 200); // no event says "RSS grew": sample it
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: n }, async () => {
      const s = performance.now();
      try {
        const res = await request(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body, dispatcher: agent });
        let first = true;
        for await (const chunk of res.body as AsyncIterable<Buffer>) {
          if (first && chunk.includes('"content":"') && !chunk.includes('"content":""')) {
            first = false;
            ttft.push(performance.now() - s);
            if (ttft.length === n) allStarted();
          }
        }
        if (res.statusCode === 200 && !first) ok++;
        else throw new Error(`HTTP ${res.statusCode}`);
      } catch (err) {
        errors++;
        firstError ??= (err as Error).message;
        if (ttft.length + errors === n) allStarted();
      }
    }).concat([
      started.then(async () => {
        peakInflight = await metricValue(worker.systemUrl, 'ebb_worker_inflight_requests');
      }),
    ]),
  );
  clearInterval(rssTimer);
  const wallMs = performance.now() - t0;
  const lagP99 = await metricValue(url, 'ebb_frontend_process_nodejs_eventloop_lag_p99_seconds');
  const lagMax = await metricValue(url, 'ebb_frontend_process_nodejs_eventloop_lag_max_seconds');
  const r = {
    streams: n,
    itl_ms: itl,
    tokens_per_stream: tokens,
    completed: ok,
    errors,
    ...(firstError ? { first_error: firstError } : {}),
    worker_inflight_when_all_started: peakInflight,
    ttft_ms_p50: +pct(ttft, 50).toFixed(1),
    ttft_ms_p99: +pct(ttft, 99).toFixed(1),
    frontend_peak_rss_mb: +peakRss.toFixed(0),
    eventloop_lag_ms_p99: +(lagP99 * 1000).toFixed(1),
    eventloop_lag_ms_max: +(lagMax * 1000).toFixed(1),
    wall_ms: Math.round(wallMs),
  };
  console.log(
    `streams: ${n} concurrent (${tokens} tokens at ${itl} ms ITL): ${ok} completed, ${errors} errors${firstError ? ` (${firstError})` : ''}; worker in-flight once all had a token: ${peakInflight}; TTFT p50 ${r.ttft_ms_p50} ms, p99 ${r.ttft_ms_p99} ms; frontend peak RSS ${r.frontend_peak_rss_mb} MB; event-loop delay p99 ${r.eventloop_lag_ms_p99} ms (max ${r.eventloop_lag_ms_max}) since start`,
  );
  out.streams = r;
  await agent.close();
  await fe.stop();
  await worker.stop();
}
console.log(JSON.stringify(out));
process.exit(0);
