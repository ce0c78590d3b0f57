import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { EventEmitter, once } from 'node:events';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { FileScaleDownLocks } from '../src/discovery/scale-down-lock.js';
import { call, openLineStream, type OpenStream } from './helpers/http.js';
import { openEventStream } from './helpers/event-stream.js';
import { bounded, runEbb, metricValues, spawnEbb, startFrontend, startWorker, tempDiscoveryUrl, WAIT_BOUND_MS, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { streamCompletion, type StreamOutcome } from './helpers/sse.js';

/**
 * One fleet for every case (cheap): four m1 workers and a frontend with its admin listener, plus
 * two m2 workers, the youngest of which can never drain (its engine cannot tell it is idle).
 */
const NO_TOKEN = { EBB_ADMIN_TOKEN: undefined };
/** The admin token of the worker that refuses the callers' drains (the last test). */
const GUARDED_TOKEN = 'a-token-the-caller-lacks';
const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

const ebb = (args: string[], boundMs = WAIT_BOUND_MS * 2) => runEbb(args, NO_TOKEN, boundMs);

let discovery = '';
let fe: FrontendHandle & { adminUrl: string };
const m1: WorkerHandle[] = [];
const m2: WorkerHandle[] = [];
const byId = (id: string) => [...m1, ...m2].find((w) => w.workerId === id) as WorkerHandle;

/** One short request: the drain ETA needs an observed per-token time. */
async function warmUp(w: WorkerHandle): Promise<void> {
  await (await openLineStream(`${w.requestUrl}/generate`, { model: w === m2[0] || w === m2[1] ? 'm2' : 'm1', prompt: 'warm', max_tokens: 3, stream: true })).done;
}

before(async () => {
  discovery = tempDiscoveryUrl();
  // Started one after the other: later ones are younger (started_at), the ranking's last tie-break.
  // No prefix cache: the blocks their streams leave would rank before age (cache value is the
  // ranking's second key, tested in victim-ranking.test), and this fleet checks work and age.
  // Long leases: the CLI reads discovery itself, and a worker whose heartbeat a loaded machine delayed past a
  // short lease would be missing from its ranking (4 serving read as 2 with two suites on 2 cores).
  for (const id of ['m1-a', 'm1-b', 'm1-c', 'm1-d']) {
    const w = await startWorker(['--discovery', discovery, '--model', 'm1', '--worker-id', id, '--mocker-itl-ms', '20', '--mocker-kv-cache', 'off', '--lease-ttl-ms', '60000', '--mocker-max-context', '8192'], NO_TOKEN);
    started.push(w);
    m1.push(w);
  }
  for (const [id, extra] of [['m2-ok', []], ['m2-stuck', ['--mocker-idleness', 'unknown']]] as const) {
    // A long lease: m2-ok is SIGSTOPped below and must stay in discovery meanwhile, however slow the machine.
    const w = await startWorker(['--discovery', discovery, '--model', 'm2', '--worker-id', id, '--mocker-itl-ms', '20', '--lease-ttl-ms', '60000', ...extra], NO_TOKEN);
    started.push(w);
    m2.push(w);
  }
  await Promise.all([...m1, ...m2].map(warmUp));
  // It reads every worker's status with the token the last test's worker holds (a worker's reads need
  // its token); the callers of its admin API hold none.
  const frontend = await startFrontend(discovery, ['--admin-port', '0'], { ...NO_TOKEN, EBB_WORKER_ADMIN_TOKEN: GUARDED_TOKEN });
  started.push(frontend);
  const adminUrl = (await frontend.waitForEvent('frontend_ready')).admin_url as string;
  for (const w of [...m1, ...m2])
    await frontend.waitForLog((l) => (l.event === 'worker_added' && l.worker_id === w.workerId) || (l.event === 'discovery_reset' && (l.workers as string[]).includes(w.workerId)), `frontend sees ${w.workerId}`);
  fe = Object.assign(frontend, { adminUrl });
});

async function resume(ids: string[]): Promise<void> {
  for (const id of ids) {
    const mark = fe.mark();
    const r = await call('POST', `${byId(id).systemUrl}/engine/resume`);
    assert.equal(r.body.state, 'serving', JSON.stringify(r.body));
    await fe.waitForLog((l) => l.event === 'worker_added' && l.worker_id === id, `frontend sees ${id} back`, { after: mark });
  }
}

describe('ebb scale-down: the victims', () => {
  it('takes the idle worker and the one whose work ends first, shows why, and leaves the long streams alone', async () => {
    const [a, b, c, d] = m1 as [WorkerHandle, WorkerHandle, WorkerHandle, WorkerHandle];
    // Uneven load: a idle; b ends in under a second; c and d run for a minute or more (they are cut at the end),
    // so they still run at the last ranking below however slow the machine.
    const open = (w: WorkerHandle, max_tokens: number) => openLineStream(`${w.requestUrl}/generate`, { model: 'm1', prompt: 'p', max_tokens, stream: true });
    const streams: OpenStream[] = [await open(b, 40), await open(c, 3000), await open(d, 4000)];
    await Promise.all(streams.map((s) => s.first));

    // Serving workers report the drain ETA they would have if drained now.
    const sb = (await call('GET', `${b.systemUrl}/engine/status`)).body;
    const sc = (await call('GET', `${c.systemUrl}/engine/status`)).body;
    assert.equal(sb.state, 'serving');
    assert.equal(sb.eta_ms, null, 'eta_ms stays the draining ETA');
    assert.equal(typeof sb.eta_if_drained_ms, 'number', JSON.stringify(sb));
    assert.ok(sb.eta_if_drained_ms < sc.eta_if_drained_ms, `b (${sb.eta_if_drained_ms}) ends before c (${sc.eta_if_drained_ms})`);
    assert.equal((await call('GET', `${a.systemUrl}/engine/status`)).body.eta_if_drained_ms, 0, 'idle: nothing to wait for');
    assert.match(sb.started_at, /^\d{4}-\d\d-\d\dT/);

    const dry = await ebb(['scale-down', '--model', 'm1', '--count', '2', '--dry-run', '--json', '--frontend', fe.adminUrl]);
    assert.equal(dry.code, 0, dry.stderr);
    const plan = JSON.parse(dry.stdout);
    assert.deepEqual(plan.victims.map((v: { worker_id: string }) => v.worker_id).sort(), ['m1-a', 'm1-b']);
    assert.deepEqual(plan.ranking.slice(2).map((v: { worker_id: string }) => v.worker_id), ['m1-c', 'm1-d'], 'c ends before d');
    assert.match(plan.victims.find((v: { worker_id: string }) => v.worker_id === 'm1-a').reason, /idle/);
    const text = await ebb(['scale-down', '--model', 'm1', '--count', '2', '--dry-run', '--discovery', discovery]);
    assert.equal(text.code, 0, text.stderr);
    assert.match(text.stdout, /\* +\d\. m1-a \(aggregated\): /);
    assert.match(text.stdout, /\s+4\. m1-d \(aggregated\): its work ends in/);
    assert.equal((await call('GET', `${a.systemUrl}/engine/status`)).body.state, 'serving', 'a dry run drains nothing');

    const run = await ebb(['scale-down', '--model', 'm1', '--count', '2', '--wait', '--timeout', '30s', '--json', '--frontend', fe.adminUrl]);
    assert.equal(run.code, 0, run.stderr);
    const out = JSON.parse(run.stdout);
    assert.deepEqual(out.victims.map((v: { worker_id: string }) => v.worker_id).sort(), ['m1-a', 'm1-b']);
    assert.ok(out.victims.every((v: { state: string; reason: string }) => v.state === 'drained' && v.reason.length > 0));
    const bLines = await streams[0]!.done;
    assert.match(bLines[bLines.length - 1] as string, /"done":true/, "b's stream finished whole before b was drained");
    assert.equal(bLines.length, 41);
    for (const w of [c, d]) assert.equal((await call('GET', `${w.systemUrl}/engine/status`)).body.state, 'serving');
    for (const s of streams.slice(1)) s.abort();
    await resume(['m1-a', 'm1-b']);
  });

  it('takes the youngest among idle workers', async () => {
    // c and d just lost their clients: wait until every m1 worker is idle again.
    for (const w of m1) {
      const events = await openEventStream(`${w.systemUrl}/engine/status/events`);
      try {
        await events.waitFor((e) => e.event === 'status' && e.data.inflight_requests === 0, `${w.workerId} idle`);
      } finally {
        events.close();
      }
    }
    const dry = await ebb(['scale-down', '--model', 'm1', '--count', '1', '--dry-run', '--json', '--frontend', fe.adminUrl]);
    assert.equal(dry.code, 0, dry.stderr);
    const plan = JSON.parse(dry.stdout);
    assert.deepEqual(plan.ranking.map((r: { worker_id: string }) => r.worker_id), ['m1-d', 'm1-c', 'm1-b', 'm1-a'], dry.stdout);
  });

  it('refuses to take every worker of the pool', async () => {
    const r = await ebb(['scale-down', '--model', 'm1', '--count', '4', '--dry-run', '--frontend', fe.adminUrl]);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /would leave none to take over their streams \(at most 3\)/);
  });
});

describe('ebb scale-down: all or nothing', () => {
  it('resumes a victim that does not drain within --timeout and exits 2', async () => {
    const r = await ebb(['scale-down', '--model', 'm2', '--count', '1', '--wait', '--timeout', '1s', '--discovery', discovery]);
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /m2-stuck: draining/, 'the youngest idle worker was the victim');
    assert.match(r.stderr, /rolled back: .*m2-stuck.* did not drain within 1\.0s.*every victim was resumed and nothing is to be deleted/);
    const s = (await call('GET', `${byId('m2-stuck').systemUrl}/engine/status`)).body;
    assert.equal(s.state, 'serving');
    assert.equal(s.discovery_registered, true, 'back in discovery');
    assert.equal(r.stdout, '', 'no victim reported as deletable');
  });
});

describe('frontend admin API: POST /models/{model}/scale-down under load', () => {
  it('drains the chosen victims with no stream lost, and the fleet gauges follow', async () => {
    const gauges = (model: string) => metricValues(fe.url, [`ebb_frontend_fleet_serving_workers{model="${model}",mode="aggregated"}`, `ebb_frontend_scale_downs_total{outcome="started",by="frontend"}`, `ebb_frontend_fleet_drainable_workers{model="${model}",mode="aggregated"}`]);
    const [serving0, started0, drainable0] = await gauges('m1');
    assert.equal(serving0, 4);
    assert.equal(started0, 1, 'one so far: the first case\'s `ebb scale-down --frontend` went through this route');
    const [dryRuns, refusals] = await metricValues(fe.url, ['ebb_frontend_scale_downs_total{outcome="dry_run",by="frontend"}', 'ebb_frontend_scale_downs_total{outcome="refused",by="frontend"}']);
    assert.deepEqual([dryRuns, refusals], [2, 1], "the CLI's dry runs with --frontend are counted too: two, and the one refused (every worker of the pool)");
    assert.equal(drainable0, 3, 'all idle: every worker but one could go now');

    const refused = await call('POST', `${fe.adminUrl}/models/nope/scale-down`, { count: 1 });
    assert.equal(refused.status, 404);
    assert.equal(refused.body.error.code, 'model_not_found');

    const outcomes: StreamOutcome[] = [];
    const completed = new EventEmitter();
    let stop = false;
    const loops = Array.from({ length: 6 }, async (_, i) => {
      while (!stop) {
        outcomes.push(await streamCompletion(fe.url, { model: 'm1', max_tokens: 30, seed: i }));
        completed.emit('one');
      }
    });
    const completedAtLeast = (n: number, what: string) =>
      bounded(
        (async () => {
          while (outcomes.length < n) await once(completed, 'one');
        })(),
        what,
      );
    const fleet = await openEventStream(`${fe.adminUrl}/workers/events`);
    try {
      await completedAtLeast(12, 'load under way');
      const res = await call('POST', `${fe.adminUrl}/models/m1/scale-down`, { count: 2, deadline_ms: 200 });
      assert.equal(res.status, 202, JSON.stringify(res.body));
      const victims: string[] = res.body.victims.map((v: { worker_id: string }) => v.worker_id);
      assert.equal(victims.length, 2);
      assert.ok(res.body.victims.every((v: { worker_id: string; status_url: string; events_url: string; reason: string }) => v.status_url === `/workers/${v.worker_id}` && v.events_url === '/workers/events' && v.reason), JSON.stringify(res.body));
      for (const id of victims) await fleet.waitFor((e) => e.event === 'status' && e.data.worker_id === id && e.data.status.state === 'drained', `${id} drained`);
      const after = outcomes.length;
      await completedAtLeast(after + 12, 'load goes on');
      stop = true;
      await Promise.all(loops);
      const failures = outcomes.filter((o) => o.status !== 200 || !o.done || o.tokens !== 30 || o.error);
      assert.deepEqual(failures, [], 'every stream completes with all its tokens');
      const [serving1, started1] = await gauges('m1');
      assert.equal(serving1, 2);
      assert.equal(started1, 2);
      await resume(victims);
    } finally {
      stop = true;
      fleet.close();
    }
  });
});

describe('frontend admin API: POST /models/{model}/scale-down behind an admin token', () => {
  it('refuses without the token (401) or with a wrong one (403), and answers the dry run with it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'ebb-scale-down-token-'));
    const tokenFile = join(dir, 'admin-token');
    writeFileSync(tokenFile, 'sekrit-token\n', { mode: 0o600 });
    const guarded = await startFrontend(discovery, ['--admin-port', '0', '--admin-token-file', tokenFile], NO_TOKEN);
    started.push(guarded);
    const admin = (await guarded.waitForEvent('frontend_ready')).admin_url as string;
    const url = `${admin}/models/m1/scale-down`;
    const none = await call('POST', url, { count: 1, dry_run: true });
    assert.equal(none.status, 401);
    assert.equal(none.body.error.code, 'unauthorized');
    const wrong = await call('POST', url, { count: 1, dry_run: true }, { authorization: 'Bearer nope' });
    assert.equal(wrong.status, 403);
    for (const w of m1)
      await guarded.waitForLog((l) => (l.event === 'worker_added' && l.worker_id === w.workerId) || (l.event === 'discovery_reset' && (l.workers as string[]).includes(w.workerId)), `sees ${w.workerId}`);
    const ok = await call('POST', url, { count: 1, dry_run: true }, { authorization: 'Bearer sekrit-token' });
    assert.equal(ok.status, 200, JSON.stringify(ok.body));
    assert.equal(ok.body.victims.length, 1);
    for (const w of m1) assert.equal((await call('GET', `${w.systemUrl}/engine/status`)).body.state, 'serving', 'a dry run drains nothing');
  });
});

/** The m1 workers' states, read from each worker. */
async function statesOf(ws: WorkerHandle[]): Promise<Map<string, string>> {
  return new Map(await Promise.all(ws.map(async (w) => [w.workerId, (await call('GET', `${w.systemUrl}/engine/status`)).body.state as string] as const)));
}
const drainedIds = (states: Map<string, string>) => [...states].flatMap(([id, s]) => (s === 'serving' ? [] : [id]));

describe('ebb scale-down: one at a time per model, across CLIs and frontends (the lock in discovery)', () => {
  it('refuses while another holds the lock (CLI and admin API, 409), takes over a dead holder\'s, and 4 concurrent CLIs drain distinct victims and leave one serving', async () => {
    const dir = fileURLToPath(discovery);
    const release = await new FileScaleDownLocks(dir).acquire('m1', 'the test, holding it');
    try {
      const r = await ebb(['scale-down', '--model', 'm1', '--count', '1', '--discovery', discovery]);
      assert.equal(r.code, 1, r.stderr);
      assert.match(r.stderr, /a scale-down of m1 is choosing and draining its victims \(the test, holding it\)/);
      const api = await call('POST', `${fe.adminUrl}/models/m1/scale-down`, { count: 1 });
      assert.equal(api.status, 409, JSON.stringify(api.body));
      assert.equal(api.body.error.code, 'scale_down_in_progress');
      const viaFrontend = await ebb(['scale-down', '--model', 'm1', '--count', '1', '--frontend', fe.adminUrl]);
      assert.equal(viaFrontend.code, 1, viaFrontend.stderr);
      assert.match(viaFrontend.stderr, /HTTP 409: a scale-down of m1 is choosing/);
      assert.deepEqual(drainedIds(await statesOf(m1)), [], 'nothing drained while the lock is held');
    } finally {
      await release();
    }
    // A holder that died (its pid is gone) does not block the next one.
    const dead = spawn(process.execPath, ['-e', '']);
    await once(dead, 'exit');
    writeFileSync(join(dir, '.scale-down.m1.lock'), JSON.stringify({ pid: dead.pid, holder: 'a CLI that was SIGKILLed' }), { mode: 0o600 });
    const after = await ebb(['scale-down', '--model', 'm1', '--count', '1', '--discovery', discovery, '--json']);
    assert.equal(after.code, 0, after.stderr);
    await resume(JSON.parse(after.stdout).victims.map((v: { worker_id: string }) => v.worker_id));

    const runs = await Promise.all(Array.from({ length: 4 }, () => ebb(['scale-down', '--model', 'm1', '--count', '1', '--discovery', discovery, '--json'])));
    const named = runs.flatMap((r) => (r.code === 0 ? JSON.parse(r.stdout).victims.map((v: { worker_id: string }) => v.worker_id as string) : []));
    for (const r of runs) if (r.code !== 0) assert.match(r.stderr, /is choosing and draining its victims|would leave none/, r.stderr);
    assert.equal(new Set(named).size, named.length, `no victim named twice: ${named.join(', ')}`);
    const drained = drainedIds(await statesOf(m1));
    assert.deepEqual([...drained].sort(), [...named].sort(), 'the workers drained are the ones reported');
    assert.ok(drained.length <= 3, `one serving worker left: ${drained.join(', ')}`);
    await resume(drained);
  });
});

describe('ebb scale-down --wait: rolled back without the frontend, and on Ctrl-C', () => {
  it('resumes the victim at its own system URL when the frontend is SIGKILLed mid --wait', async () => {
    const lone = await startFrontend(discovery, ['--admin-port', '0'], NO_TOKEN);
    started.push(lone);
    const admin = (await lone.waitForEvent('frontend_ready')).admin_url as string;
    for (const w of m2) await lone.waitForLog((l) => (l.event === 'worker_added' && l.worker_id === w.workerId) || (l.event === 'discovery_reset' && (l.workers as string[]).includes(w.workerId)), `sees ${w.workerId}`);
    const cli = spawnEbb(['scale-down', '--model', 'm2', '--count', '1', '--wait', '--timeout', '10m', '--frontend', admin], 'ebb scale-down', NO_TOKEN);
    started.push(cli);
    // m2-stuck never drains: the command is waiting when its progress line comes.
    await cli.waitForStderr(/^ {2}m2-stuck: /);
    await lone.stop();
    assert.equal(await cli.exitCode(), 1, cli.stderr.join('\n'));
    assert.match(cli.stderr.join('\n'), /m2-stuck: resumed at its own system URL/);
    assert.match(cli.stderr.join('\n'), /every victim was resumed and nothing is to be deleted/);
    const s = (await call('GET', `${byId('m2-stuck').systemUrl}/engine/status`)).body;
    assert.equal(s.state, 'serving');
    assert.equal(s.discovery_registered, true);
  });

  it('resumes the victim on SIGINT during --wait and exits 130', async () => {
    const cli = spawnEbb(['scale-down', '--model', 'm2', '--count', '1', '--wait', '--timeout', '10m', '--discovery', discovery], 'ebb scale-down', NO_TOKEN);
    started.push(cli);
    await cli.waitForStderr(/^ {2}m2-stuck: /);
    cli.signal('SIGINT');
    assert.equal(await cli.exitCode(), 130, cli.stderr.join('\n'));
    assert.match(cli.stderr.join('\n'), /rolled back: interrupted by SIGINT; every victim was resumed/);
    assert.equal((await call('GET', `${byId('m2-stuck').systemUrl}/engine/status`)).body.state, 'serving');
  });
});

describe('ebb scale-down: every worker ranked, and exactly the victims named', () => {
  it('refuses, naming it, when a worker of the model does not answer its status', async () => {
    const ok = byId('m2-ok');
    ok.signal('SIGSTOP');
    try {
      const r = await ebb(['scale-down', '--model', 'm2', '--count', '1', '--dry-run', '--discovery', discovery]);
      assert.equal(r.code, 1, r.stderr);
      assert.match(r.stderr, /worker\(s\) m2-ok of model "m2" did not answer their status: a ranking without them could pass over the best victim/);
    } finally {
      ok.signal('SIGCONT');
    }
  });

  it('prints the dry run one row a line, and --workers drains exactly the named ones (refused if one is not serving)', async () => {
    const dry = await ebb(['scale-down', '--model', 'm1', '--count', '1', '--dry-run', '--discovery', discovery]);
    assert.equal(dry.code, 0, dry.stderr);
    assert.ok(!dry.stdout.includes('\\n'), dry.stdout);
    const rows = dry.stdout.split('\n').filter((l) => /^[* ] +\d\. m1-/.test(l));
    assert.equal(rows.length, 4, dry.stdout);
    const [first, last] = [rows[0] as string, rows[3] as string].map((l) => /m1-\w/.exec(l)?.[0] as string);
    assert.match(dry.stdout, new RegExp(`to drain exactly these: ebb scale-down --model m1 --workers ${first}`));
    // The last of the ranking, named: it is the one drained.
    const named = await ebb(['scale-down', '--model', 'm1', '--workers', last as string, '--discovery', discovery, '--json']);
    assert.equal(named.code, 0, named.stderr);
    assert.deepEqual(JSON.parse(named.stdout).victims.map((v: { worker_id: string }) => v.worker_id), [last]);
    assert.deepEqual(drainedIds(await statesOf(m1)), [last]);
    const again = await ebb(['scale-down', '--model', 'm1', '--workers', `${first},${last}`, '--discovery', discovery]);
    assert.equal(again.code, 1, again.stderr);
    assert.match(again.stderr, new RegExp(`worker\\(s\\) ${last} of model "m1" no longer serving`));
    assert.deepEqual(drainedIds(await statesOf(m1)), [last], 'nothing more drained');
    await resume([last as string]);
    // The admin API's `workers`, as the dashboard's confirm sends the victims it showed.
    const api = await call('POST', `${fe.adminUrl}/models/m1/scale-down`, { count: 1, workers: [last] });
    assert.equal(api.status, 202, JSON.stringify(api.body));
    assert.deepEqual(api.body.victims.map((v: { worker_id: string }) => v.worker_id), [last]);
    assert.equal(typeof api.body.victims[0].generation, 'number', 'the generation a waiter pins');
    const gone = await call('POST', `${fe.adminUrl}/models/m1/scale-down`, { count: 1, workers: [last] });
    assert.equal(gone.status, 400, JSON.stringify(gone.body));
    assert.match(gone.body.error.message, /no longer serving/);
    await resume([last as string]);
  });
});

describe('frontend admin API: POST /models/{model}/scale-down starts whole or not at all', () => {
  // Last in this file: it adds a fifth m1 worker.
  it('resumes the victim that took its drain when another refuses its own, and says so', async () => {
    // This worker wants a token the caller does not have: it refuses the drain forwarded with the caller's credential.
    const guarded = await startWorker(['--discovery', discovery, '--model', 'm1', '--worker-id', 'm1-t', '--mocker-itl-ms', '20', '--mocker-kv-cache', 'off'], { EBB_ADMIN_TOKEN: GUARDED_TOKEN });
    started.push(guarded);
    await fe.waitForLog((l) => l.event === 'worker_added' && l.worker_id === 'm1-t', 'frontend sees m1-t');
    const a = byId('m1-a');
    const before = (await call('GET', `${a.systemUrl}/engine/status`)).body;
    assert.equal(before.state, 'serving');
    const r = await call('POST', `${fe.adminUrl}/models/m1/scale-down`, { count: 2, workers: ['m1-a', 'm1-t'] });
    assert.equal(r.status, 401, JSON.stringify(r.body));
    assert.match(r.body.error.message, /scale-down of m1 not started: victim m1-t refused its drain \(HTTP 401: [^)]*\); the other victims were resumed/);
    const after = (await call('GET', `${a.systemUrl}/engine/status`)).body;
    assert.equal(after.state, 'serving', 'm1-a resumed');
    assert.equal(after.generation, before.generation + 2, 'm1-a took its drain, then its resume');
    assert.equal((await call('GET', `${guarded.systemUrl}/engine/status`, undefined, { authorization: `Bearer ${GUARDED_TOKEN}` })).body.state, 'serving');
  });
});
