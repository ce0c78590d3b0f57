import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { EventEmitter, once } from 'node:events';
import { mkdtempSync, readFileSync, unlinkSync, writeFileSync } from 'node:fs';
import { createServer as createHttpServer } from 'node:http';
import { createServer, type Server, type Socket } from 'node:net';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { call, openLineStream } from './helpers/http.js';
import { bounded, CLI, runEbb, startFrontend, startWorker, tempDiscoveryUrl, WAIT_BOUND_MS, type EbbProcess, type LogLine, type WorkerHandle } from './helpers/processes.js';
import { streamCompletion, type StreamOutcome } from './helpers/sse.js';

const started: EbbProcess[] = [];
const servers: Server[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
  for (const s of servers) s.close();
});

const NO_TOKEN = { EBB_ADMIN_TOKEN: undefined };

const ebb = (args: string[], boundMs = WAIT_BOUND_MS) => runEbb(args, NO_TOKEN, boundMs);

function sees(fe: EbbProcess, id: string) {
  return fe.waitForLog(
    (l) => (l.event === 'worker_added' && l.worker_id === id) || (l.event === 'discovery_reset' && (l.workers as string[]).includes(id)),
    `frontend sees ${id}`,
  );
}

async function cluster(ids: string[], workerArgs: string[] = [], perWorker: Record<string, string[]> = {}) {
  const discovery = tempDiscoveryUrl();
  const workers: WorkerHandle[] = [];
  for (const id of ids) {
    const w = await startWorker(['--discovery', discovery, '--model', 'm1', '--worker-id', id, ...workerArgs, ...(perWorker[id] ?? [])], NO_TOKEN);
    started.push(w);
    workers.push(w);
  }
  return { discovery, workers };
}

async function frontendFor(discovery: string, workers: WorkerHandle[]) {
  const fe = await startFrontend(discovery, ['--admin-port', '0']);
  started.push(fe);
  const adminUrl = (await fe.waitForEvent('frontend_ready')).admin_url as string;
  for (const w of workers) await sees(fe, w.workerId);
  return Object.assign(fe, { adminUrl });
}

/** A file-discovery record nobody heartbeats: held by this (live) test process, fresh for five minutes (the longest TTL file discovery accepts). */
function fakeRecord(discovery: string, id: string, url: string): string {
  const path = join(fileURLToPath(discovery), `${id}.json`);
  const record = { worker_id: id, model: 'm1', mode: 'aggregated', request_url: url, system_url: url };
  writeFileSync(path, JSON.stringify({ record, pid: process.pid, hostname: hostname(), heartbeat_at: Date.now(), ttl_ms: 300_000 }));
  return path;
}

async function listening(server: Server): Promise<string> {
  servers.push(server);
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const addr = server.address() as { port: number };
  return `http://127.0.0.1:${addr.port}`;
}

/** A URL where nothing listens: a port that was just bound and released. */
async function refusedUrl(): Promise<string> {
  const s = createServer();
  const url = await listening(s);
  await new Promise((resolve) => s.close(resolve));
  return url;
}

/**
 * A pass-through to a worker's system server that holds every GET /engine/status until release():
 * what happens to the worker meanwhile is what the held reads see.
 */
async function statusGate(target: string) {
  const held = new EventEmitter();
  const firstHeld = once(held, 'held');
  const queue: Array<() => void> = [];
  let holding = true;
  const server = createHttpServer((req, res) => {
    const forward = async () => {
      const chunks: Buffer[] = [];
      for await (const chunk of req) chunks.push(chunk as Buffer);
      const headers: Record<string, string> = {};
      if (req.headers['content-type']) headers['content-type'] = req.headers['content-type'];
      const body = chunks.length > 0 ? Buffer.concat(chunks) : undefined;
      // Streamed through, so the status stream (GET /engine/status/events) passes as well as reads.
      const gone = new AbortController();
      res.once('close', () => gone.abort());
      const answer = await fetch(`${target}${req.url}`, { method: req.method, headers, body, signal: gone.signal });
      res.writeHead(answer.status, { 'content-type': answer.headers.get('content-type') ?? 'text/plain' });
      if (answer.body) for await (const chunk of answer.body as AsyncIterable<Uint8Array>) res.write(chunk);
      res.end();
    };
    const go = () => void forward().catch((err: Error) => res.destroy(err));
    // Status reads and the status stream alike: the CLI's first look at the worker after its drain.
    if (holding && req.method === 'GET' && (req.url === '/engine/status' || req.url === '/engine/status/events')) {
      queue.push(go);
      held.emit('held');
    } else go();
  });
  const url = await listening(server);
  return {
    url,
    firstHeld,
    release() {
      holding = false;
      for (const go of queue.splice(0)) go();
    },
  };
}

async function statusOf(w: WorkerHandle) {
  return (await call('GET', `${w.systemUrl}/engine/status`)).body as { state: string; generation: number; inflight_requests: number };
}

describe('operator CLI: fleet view', () => {
  it('lists every worker with its live state; unreachable ones are marked, never failing the call', async () => {
    const { discovery, workers } = await cluster(['f-1', 'f-2']);
    // Two fake registrations that stay in discovery: one refuses connections, one accepts and never answers.
    const refused = await refusedUrl();
    const hungSockets: Socket[] = [];
    const hung = await listening(createServer((s) => void hungSockets.push(s)));
    const refusedFile = fakeRecord(discovery, 'f-refused', refused);
    const hungFile = fakeRecord(discovery, 'f-hung', hung);
    const fe = await frontendFor(discovery, workers);
    await sees(fe, 'f-refused');
    await sees(fe, 'f-hung');

    const view = await call('GET', `${fe.adminUrl}/workers`);
    assert.equal(view.status, 200);
    const byId = new Map<string, any>(view.body.workers.map((x: { worker_id: string }) => [x.worker_id, x]));
    assert.deepEqual([...byId.keys()].sort(), ['f-1', 'f-2', 'f-hung', 'f-refused']);
    for (const w of workers) {
      const entry = byId.get(w.workerId);
      assert.equal(entry.reachable, true);
      assert.equal(entry.state, 'serving');
      assert.equal(entry.status.inflight_requests, 0);
      assert.equal(entry.system_url, w.systemUrl);
      assert.equal(entry.request_url, w.requestUrl);
      assert.equal(entry.in_discovery, true);
    }
    assert.equal(byId.get('f-refused').reachable, false);
    assert.match(byId.get('f-refused').error, /ECONNREFUSED/);
    assert.equal(byId.get('f-hung').reachable, false);
    assert.match(byId.get('f-hung').error, /timed out after 1000 ms/);

    const json = await ebb(['workers', '--frontend', fe.adminUrl, '--json']);
    assert.equal(json.code, 0, json.stderr);
    assert.deepEqual(JSON.parse(json.stdout).workers.map((x: { worker_id: string }) => x.worker_id), ['f-1', 'f-2', 'f-hung', 'f-refused']);
    const table = await ebb(['workers', '--frontend', fe.adminUrl]);
    assert.equal(table.code, 0, table.stderr);
    const rows = table.stdout.trim().split('\n');
    assert.match(rows[0] ?? '', /^ID\s+MODEL\s+MODE\s+STATE\s+IN-FLIGHT/);
    assert.match(rows.find((r) => r.startsWith('f-1 ')) ?? '', /^f-1\s+m1\s+aggregated\s+serving\s+0\s/);
    assert.match(rows.find((r) => r.startsWith('f-refused')) ?? '', /unreachable\s+-\s.*ECONNREFUSED/);
    // Pointed at the OpenAI port instead of the admin listener: said so, with the port to use.
    const publicPort = await ebb(['workers', '--frontend', fe.url]);
    assert.equal(publicPort.code, 1, publicPort.stdout);
    assert.match(publicPort.stderr, new RegExp(`is a frontend's OpenAI port, not its admin API, which listens on --admin-port .*try --frontend http://127\\.0\\.0\\.1:${Number(new URL(fe.url).port) + 1}`));
    // From discovery, the CLI reads each status itself.
    const fromDiscovery = await ebb(['workers', '--discovery', discovery]);
    assert.equal(fromDiscovery.code, 0, fromDiscovery.stderr);
    assert.match(fromDiscovery.stdout, /f-2\s+m1\s+aggregated\s+serving/);
    assert.match(fromDiscovery.stdout, /f-hung\s+m1\s+aggregated\s+unreachable/);

    // A drained worker leaves discovery but stays in the fleet view (it answers), so it can be resumed by id.
    const beforeDrain = fe.mark();
    const drain = await ebb(['drain', 'f-1', '--frontend', fe.adminUrl]);
    assert.equal(drain.code, 0, drain.stderr);
    await fe.waitForEvent('worker_removed', (l) => l.worker_id === 'f-1', { after: beforeDrain });
    const status = await ebb(['status', 'f-1', '--frontend', fe.adminUrl, '--json']);
    assert.equal(status.code, 0, status.stderr);
    assert.ok(['draining', 'drained'].includes(JSON.parse(status.stdout).state));
    const left = (await call('GET', `${fe.adminUrl}/workers/f-1`)).body;
    assert.equal(left.in_discovery, false);
    assert.equal(left.reachable, true);
    // Only a worker_added after the resume counts: f-1's from start-up is still in the log.
    const beforeResume = fe.mark();
    const resume = await ebb(['resume', 'f-1', '--frontend', fe.adminUrl]);
    assert.equal(resume.code, 0, resume.stderr);
    assert.match(resume.stdout, /^worker f-1: serving/);
    await fe.waitForEvent('worker_added', (l) => l.worker_id === 'f-1', { after: beforeResume });

    // A worker that left discovery and no longer answers is forgotten.
    const beforeUnlink = fe.mark();
    unlinkSync(refusedFile);
    await fe.waitForEvent('worker_removed', (l) => l.worker_id === 'f-refused', { after: beforeUnlink });
    const after = await call('GET', `${fe.adminUrl}/workers`);
    assert.deepEqual(after.body.workers.map((x: { worker_id: string }) => x.worker_id), ['f-1', 'f-2', 'f-hung']);
    assert.equal((await call('GET', `${fe.adminUrl}/workers/f-refused`)).status, 404);
    const gone = await ebb(['status', 'f-refused', '--frontend', fe.adminUrl]);
    assert.equal(gone.code, 1);
    assert.match(gone.stderr, /^ebb: no worker "f-refused" is known to the frontend admin API at /);
    // Only the admin API's worker_not_found means "unknown worker": a 404 from the wrong port is not that.
    const wrongPort = await ebb(['status', 'f-1', '--frontend', fe.url]);
    assert.equal(wrongPort.code, 1);
    const adminPort = `http://127.0.0.1:${Number(new URL(fe.url).port) + 1}`;
    assert.equal(
      wrongPort.stderr,
      `ebb: the frontend admin API at ${fe.url} answered HTTP 404 for worker "f-1": no route for GET /workers/f-1; ${fe.url} is a frontend's OpenAI port, not its admin API, which listens on --admin-port (default: --port + 1: try --frontend ${adminPort})\n`,
    );

    unlinkSync(hungFile);
    for (const s of hungSockets) s.destroy();
  });

  it('errors are one clear line', async () => {
    const url = await refusedUrl();
    const direct = await ebb(['status', url]);
    assert.equal(direct.code, 1);
    assert.equal(direct.stderr, `ebb: cannot reach worker at ${url}: ECONNREFUSED\n`);
    const viaFrontend = await ebb(['workers', '--frontend', url]);
    assert.equal(viaFrontend.code, 1);
    assert.equal(viaFrontend.stderr, `ebb: cannot reach the frontend admin API at ${url}: ECONNREFUSED\n`);
    const notInDiscovery = await ebb(['drain', 'w-nobody', '--discovery', tempDiscoveryUrl()]);
    assert.equal(notInDiscovery.code, 1);
    assert.match(notInDiscovery.stderr, /^ebb: worker "w-nobody" is not in discovery at .*: pass its system URL, or --frontend URL/);
    assert.equal(notInDiscovery.stderr.split('\n').length, 2, 'one line');
  });
});

/**
 * One worker shared by the drain --wait tests, each of which leaves it drained (or draining until its
 * stream ends): resumed here first. 12 ms a token: a stream outlives starting the CLI by seconds.
 */
let drainTarget: ReturnType<typeof cluster> | undefined;
async function servingDrainTarget() {
  const { discovery, workers } = await (drainTarget ??= cluster(['d-1'], ['--mocker-itl-ms', '12', '--mocker-ttft-ms', '5']));
  const w = workers[0]!;
  if ((await statusOf(w)).state !== 'serving') assert.equal((await call('POST', `${w.systemUrl}/engine/resume`)).body.state, 'serving');
  return { discovery, w };
}

/**
 * Two workers, s-1 never idle (its engine cannot tell: fail-closed), shared by the tests of a drain
 * and a rollout that time out.
 */
let stuckFleet: ReturnType<typeof cluster> | undefined;
const stuck = () => (stuckFleet ??= cluster(['s-1', 's-2'], [], { 's-1': ['--mocker-idleness', 'unknown'] }));

describe('operator CLI: drain --wait', () => {
  it('exits 0 once the worker is drained; the stream in flight finishes whole', async () => {
    // 500 tokens at 12 ms: the stream outlives starting the CLI by seconds (asserted below, not assumed).
    const { discovery, w } = await servingDrainTarget();
    const TOKENS = 500;
    const stream = await openLineStream(`${w.requestUrl}/generate`, { model: 'm1', prompt: 'a long answer', max_tokens: TOKENS, stream: true });
    assert.equal(stream.status, 200);
    await stream.first;

    const beforeDrain = w.mark();
    const drain = await ebb(['drain', 'd-1', '--wait', '--timeout', '1m', '--discovery', discovery], 60_000);
    assert.equal(drain.code, 0, drain.stderr);
    assert.match(drain.stdout, /^worker d-1 drained in /);
    // Not a TTY: one progress line per change, counting the stream down.
    assert.match(drain.stderr, /d-1: draining, in-flight 1, waiting for: 1 in-flight request/);
    const drainedEvent = await w.waitForEvent('state_changed', (l) => l.to === 'drained', { after: beforeDrain });
    const drainingEvent = await w.waitForEvent('state_changed', (l) => l.to === 'draining', { after: beforeDrain });
    assert.equal(drainingEvent.inflight, 1, 'the stream was in flight when the drain began');
    assert.equal(drainedEvent.inflight, 0);

    const lines = (await stream.done).map((l) => JSON.parse(l));
    assert.equal(lines.filter((l) => 'text' in l).length, TOKENS, 'every token arrived');
    assert.equal(lines.at(-1)?.done, true);
    assert.equal((await statusOf(w)).state, 'drained');
  });

  it('--deadline hands the stream still running off at the deadline: drained, and the stream ends with a hand-off line', async () => {
    const { discovery, w } = await servingDrainTarget();
    const TOKENS = 5000; // a minute of tokens: only a hand-off ends it within the test
    const stream = await openLineStream(`${w.requestUrl}/generate`, { model: 'm1', prompt: 'a long answer', max_tokens: TOKENS, stream: true });
    assert.equal(stream.status, 200);
    await stream.first;
    const drain = await ebb(['drain', 'd-1', '--wait', '--deadline', '300ms', '--json', '--discovery', discovery], 60_000);
    assert.equal(drain.code, 0, drain.stderr);
    const status = JSON.parse(drain.stdout);
    assert.equal(status.state, 'drained');
    assert.equal(status.handed_off, 1);
    const lines = (await stream.done).map((l) => JSON.parse(l));
    const handoff = lines.at(-1)?.handoff;
    assert.equal(handoff?.reason, 'drain_deadline');
    assert.equal(handoff?.completion_tokens, lines.filter((l) => 'text' in l).length, 'the hand-off counts what was streamed');
    assert.ok(handoff.completion_tokens < TOKENS);
  });

  it('exits 1, naming the generation change, when someone else resumes and drains the worker meanwhile', async () => {
    const { w } = await servingDrainTarget();
    const g = (await statusOf(w)).generation;
    const TOKENS = 500;
    const stream = await openLineStream(`${w.requestUrl}/generate`, { model: 'm1', prompt: 'a long answer', max_tokens: TOKENS, stream: true });
    assert.equal(stream.status, 200);
    await stream.first;

    // The CLI reaches the worker through a gate that holds its status reads, so the resume and the
    // second drain below land, deterministically, between its drain call and its first status read.
    const gate = await statusGate(w.systemUrl);
    const cli = ebb(['drain', gate.url, '--wait', '--timeout', '1m'], 60_000);
    await bounded(gate.firstHeld, 'the CLI to read status after its drain');
    assert.equal((await statusOf(w)).generation, g + 1, "the CLI's drain");
    assert.equal((await call('POST', `${w.systemUrl}/engine/resume`)).body.state, 'serving');
    const other = await call('POST', `${w.systemUrl}/engine/drain`, { reason: 'someone else' });
    assert.equal(other.status, 202, 'the stream is still in flight');
    assert.equal(other.body.generation, g + 3);
    gate.release();

    const res = await cli;
    assert.equal(res.code, 1, res.stderr);
    assert.equal(res.stdout, '', 'no "drained" report for a drain that is not ours');
    const last = res.stderr.trim().split('\n').at(-1) ?? '';
    const changed = `went from generation ${g + 1} to ${g + 3} \\(now draining\\) while waiting for it to drain: someone else resumed or drained it`;
    assert.match(last, new RegExp(`^ebb: worker at http://127\\.0\\.0\\.1:\\d+ ${changed}`));
    const lines = (await stream.done).map((l) => JSON.parse(l));
    assert.equal(lines.filter((l) => 'text' in l).length, TOKENS, 'the other drain goes on; the stream finishes whole');
  });

  it('exits 2 with a clear message when the worker does not drain before --timeout', async () => {
    const w = (await stuck()).workers[0]!;
    const drain = await ebb(['drain', w.systemUrl, '--wait', '--timeout', '1s']);
    assert.equal(drain.code, 2);
    const last = drain.stderr.trim().split('\n').at(-1) ?? '';
    assert.match(last, /^ebb: worker at http:\/\/127\.0\.0\.1:\d+ did not drain within 1\.0s \(still draining, in-flight 0, waiting for: engine idleness unknown/);
    assert.equal((await statusOf(w)).state, 'draining', 'the drain itself goes on');
    // Back in rotation for the rollout that times out on it below.
    assert.equal((await call('POST', `${w.systemUrl}/engine/resume`)).body.state, 'serving');
  });
});

/** state_changed events of every worker, in time order; on equal timestamps, leaving rotation first (the strict reading). */
function transitions(workers: WorkerHandle[]) {
  const events = workers.flatMap((w) =>
    // From the first registration on: loading -> serving is the worker starting, not the rollout.
    w.logs.filter((l: LogLine) => l.event === 'state_changed' && l.from !== 'loading').map((l) => ({ worker: w.workerId, at: Date.parse(l.time as string), to: l.to as string })),
  );
  return events.sort((a, b) => a.at - b.at || (a.to === 'serving' ? 1 : 0) - (b.to === 'serving' ? 1 : 0));
}

/**
 * Three workers: rolled under load first, then by the --then-exec tests (each leaves them serving).
 * 12 ms a token: eight clients keep every worker busy through the rollout at a quarter of the
 * token rate (and CPU) 3 ms took, and a drain still waits for streams in flight.
 */
let rolledFleet: ReturnType<typeof cluster> | undefined;
const rolled = () => (rolledFleet ??= cluster(['r-1', 'r-2', 'r-3'], ['--mocker-itl-ms', '12', '--mocker-ttft-ms', '5']));

describe('operator CLI: rollout', () => {
  it('rolls 3 workers under load: no failed request, never more than one out of rotation', async () => {
    const { discovery, workers } = await rolled();
    const fe = await frontendFor(discovery, workers);
    const MAX_TOKENS = 20;
    const outcomes: StreamOutcome[] = [];
    const progress = new EventEmitter();
    let stop = false;
    const loops = Array.from({ length: 8 }, async (_, i) => {
      while (!stop && outcomes.length < 5000) {
        outcomes.push(await streamCompletion(fe.url, { model: 'm1', max_tokens: MAX_TOKENS, seed: i }));
        progress.emit('completed');
      }
    });
    const completedAtLeast = (n: number) =>
      bounded(
        (async () => {
          while (outcomes.length < n) await once(progress, 'completed');
        })(),
        `${n} completed requests`,
      );
    await completedAtLeast(40);

    const rollout = await ebb(['rollout', '--model', 'm1', '--max-unavailable', '1', '--frontend', fe.adminUrl, '--timeout', '30s'], 90_000);
    assert.equal(rollout.code, 0, rollout.stderr);
    assert.match(rollout.stdout, /^rollout of m1 done: 3 worker\(s\)/);
    assert.match(rollout.stderr, /\[3\/3\] m1 is back to 3 serving worker\(s\)/);
    await completedAtLeast(outcomes.length + 40);
    stop = true;
    await bounded(Promise.all(loops), 'load loops to finish');

    const failures = outcomes.filter((o) => o.status !== 200 || !o.done || o.tokens !== MAX_TOKENS || o.error);
    assert.deepEqual(failures, [], 'every request completes with all its tokens');

    // Each worker went serving -> draining -> drained -> serving exactly once ...
    for (const w of workers) {
      const path = w.logs.filter((l) => l.event === 'state_changed' && l.from !== 'loading').map((l) => l.to);
      assert.deepEqual(path, ['draining', 'drained', 'serving'], `${w.workerId}: ${path.join(' -> ')}`);
    }
    // ... one at a time, by the workers' own clocks (same host) ...
    const out = new Set<string>();
    for (const t of transitions(workers)) {
      if (t.to === 'serving') out.delete(t.worker);
      else out.add(t.worker);
      assert.ok(out.size <= 1, `out of rotation at once: ${[...out].join(', ')}`);
    }
    // ... and in the frontend's routing view, whose log is one ordered stream.
    const routed = new Set<string>();
    for (const l of fe.logs) {
      if (l.event === 'worker_removed') routed.add(l.worker_id as string);
      if (l.event === 'worker_added') routed.delete(l.worker_id as string);
      assert.ok(routed.size <= 1, `removed from routing at once: ${[...routed].join(', ')}`);
    }
    // Not exactly 3: file discovery may coalesce a drain+resume quicker than the frontend's scan into a
    // single re-registration (a put, no delete); the workers' own logs above prove each left once.
    assert.ok(fe.logs.some((l) => l.event === 'worker_removed'), 'the routing-view check above saw workers leave');
  });

  it('runs --then-exec per drained worker with its env; a failing hook stops the rollout', async () => {
    const { discovery, workers } = await rolled();
    const dir = mkdtempSync(join(tmpdir(), 'ebb-test-hook-'));
    const out = join(dir, 'hook.out');
    const hook = join(dir, 'hook.mjs');
    // The "replacement" is the same worker resumed by the hook, after recording what it was given.
    writeFileSync(
      hook,
      `import { appendFileSync } from 'node:fs';
       const { EBB_WORKER_ID, EBB_SYSTEM_URL, EBB_REQUEST_URL } = process.env;
       const status = await (await fetch(EBB_SYSTEM_URL + '/engine/status')).json();
       appendFileSync(${JSON.stringify(out)}, [EBB_WORKER_ID, EBB_SYSTEM_URL, EBB_REQUEST_URL, status.state].join(' ') + '\\n');
       const res = await fetch(EBB_SYSTEM_URL + '/engine/resume', { method: 'POST' });
       process.exit(res.ok ? 0 : 1);`,
    );
    const ok = await ebb(['rollout', '--model', 'm1', '--discovery', discovery, '--then-exec', `"${process.execPath}" "${hook}"`, '--timeout', '30s'], 60_000);
    assert.equal(ok.code, 0, ok.stderr);
    assert.deepEqual(
      readFileSync(out, 'utf8').trim().split('\n'),
      workers.map((w) => `${w.workerId} ${w.systemUrl} ${w.requestUrl} drained`),
      'the hook ran once per worker, in order, on a drained worker',
    );

    const untouched = await Promise.all(workers.slice(1).map(statusOf));
    const failing = await ebb(['rollout', '--model', 'm1', '--discovery', discovery, '--then-exec', 'echo hook for $EBB_WORKER_ID; exit 3'], 60_000);
    assert.equal(failing.code, 1);
    assert.match(failing.stderr, /hook for r-1/);
    const last = failing.stderr.trim().split('\n').at(-1) ?? '';
    assert.match(last, /^ebb: --then-exec for worker r-1 exited with code 3; rollout stopped$/);
    assert.equal((await statusOf(workers[0]!)).state, 'drained');
    for (const [i, w] of workers.slice(1).entries()) {
      const now = await statusOf(w);
      assert.equal(now.state, 'serving', 'the rest are left serving');
      assert.equal(now.generation, untouched[i]!.generation, `${w.workerId} was not touched by the failed rollout`);
    }
  });

  it('stops, exit 2, when a worker does not drain before --timeout; the rest stay serving', async () => {
    const { discovery, workers } = await stuck();
    const res = await ebb(['rollout', '--model', 'm1', '--discovery', discovery, '--timeout', '1s']);
    assert.equal(res.code, 2, res.stderr);
    const last = res.stderr.trim().split('\n').at(-1) ?? '';
    assert.match(last, /^ebb: rollout of m1 stopped at s-1: worker s-1 \(.*\) did not drain within 1\.0s .*; 0 of 2 worker\(s\) were rolled, the others are serving/);
    assert.equal((await statusOf(workers[0]!)).state, 'draining');
    const s2 = await statusOf(workers[1]!);
    assert.equal(s2.state, 'serving');
    assert.equal(s2.generation, 0, 'never drained');
  });
});
