/**
 * A new user's first fleet, `ebb up` on one machine (one fleet for every check here): the operator
 * commands run without flags find it; its readable log lines say which worker wrote them; the
 * counters an alert watches exist at 0 before their first event.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { bounded, CLI, spawnEbb, type EbbProcess } from './helpers/processes.js';

const run = promisify(execFile);
// A runtime directory of its own: where `ebb up` says what it runs, and the default discovery.
// EBB_DISCOVERY and EBB_ADMIN_TOKEN unset (undefined values are left out of a child's environment).
const runtime = mkdtempSync(join(tmpdir(), 'ebb-runtime-'));
const env = { XDG_RUNTIME_DIR: runtime, EBB_DISCOVERY: undefined, EBB_ADMIN_TOKEN: undefined };
const tokenFile = join(runtime, 'admin-token');
writeFileSync(tokenFile, 'local-fleet-admin-token\n', { mode: 0o600 });

/** `ebb ARGS` as an operator types it: no --frontend, no --discovery; resolves with its exit code and output. */
async function ebb(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await run(process.execPath, [CLI, ...args], { env: { ...process.env, ...env }, timeout: 60_000 });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code?: unknown; stdout?: string; stderr?: string };
    return { code: typeof e.code === 'number' ? e.code : -1, stdout: e.stdout ?? '', stderr: e.stderr ?? '' };
  }
}

/** Resolves once `pattern` has appeared on the process's stderr (where `ebb up` prints its banner). */
function stderrMatch(p: EbbProcess, pattern: RegExp): Promise<RegExpMatchArray> {
  const found = () => p.stderr.join('\n').match(pattern);
  return bounded(
    new Promise((resolve, reject) => {
      const check = () => {
        const m = found();
        if (m) {
          p.proc.stderr!.off('data', check);
          resolve(m);
        }
      };
      p.proc.stderr!.on('data', check);
      p.proc.once('close', () => (found() ? resolve(found()!) : reject(new Error(`exited without ${pattern}: ${p.stderr.join('\n')}`))));
      check();
    }),
    `stderr ${pattern}`,
  );
}

/** The value of the sample of `name` whose labels include every pair of `labels`; undefined when absent. */
function sample(page: string, name: string, labels: Record<string, string>): number | undefined {
  const line = page.split('\n').find((l) => l.startsWith(`${name}{`) && Object.entries(labels).every(([k, v]) => l.includes(`${k}="${v}"`)));
  return line === undefined ? undefined : Number(line.slice(line.lastIndexOf(' ') + 1));
}

let up: EbbProcess;
let apiUrl: string;
let workers: Array<{ worker_id: string; system_url: string; state: string }>;

before(async () => {
  // --admin-host off loopback (a container's published port), which the token allows.
  up = spawnEbb(['--log-format', 'pretty', 'up', '--port', '0', '--admin-host', '0.0.0.0', '--admin-port', '0', '--admin-token-file', tokenFile, '--mocker-itl-ms', '0'], 'ebb up', env);
  const [, url] = await stderrMatch(up, /OpenAI API:\s+(\S+)\/v1/);
  apiUrl = url!;
  // The banner's dashboard is the address the admin listener was asked to bind.
  await stderrMatch(up, /Dashboard:\s+http:\/\/0\.0\.0\.0:\d+\//);
});
after(async () => {
  await up.terminate();
});

describe('operator commands without flags find the fleet `ebb up` runs', () => {
  it('ebb workers lists its workers; ebb status, drain --wait and resume act on them by id, with the token `ebb up --admin-token-file` set (reads too)', async () => {
    const unread = await ebb('workers', '--json');
    assert.notEqual(unread.code, 0, 'the fleet has an admin token: its view is not read without it');
    assert.match(unread.stderr, /HTTP 401/);
    const listed = await ebb('workers', '--json', '--token-file', tokenFile);
    assert.equal(listed.code, 0, listed.stderr);
    workers = (JSON.parse(listed.stdout) as { workers: typeof workers }).workers;
    assert.equal(workers.length, 2, listed.stdout);
    const id = workers[0]!.worker_id;
    const status = await ebb('status', id, '--token-file', tokenFile);
    assert.equal(status.code, 0, status.stderr);
    assert.match(status.stdout, new RegExp(`^worker ${id}: serving`));
    const refused = await ebb('drain', id);
    assert.notEqual(refused.code, 0, 'the fleet has an admin token: a drain without it is refused');
    assert.match(refused.stderr, /HTTP 401/);
    // The servers' flag name works on the commands too.
    const drain = await ebb('drain', id, '--wait', '--timeout', '60s', '--admin-token-file', tokenFile);
    assert.equal(drain.code, 0, drain.stderr);
    // Drained, it left discovery; `ebb up`'s frontend still knows it, so its id still works.
    const resume = await ebb('resume', id, '--token-file', tokenFile);
    assert.equal(resume.code, 0, resume.stderr);
    assert.match((await ebb('status', id, '--token-file', tokenFile)).stdout, new RegExp(`^worker ${id}: serving`));
  });
});

describe('the public API says which worker answered', () => {
  it('x-ebb-worker-id on a non-streamed answer too', async () => {
    const res = await fetch(`${apiUrl}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'ebb-mock', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }),
    });
    assert.equal(res.status, 200);
    await res.json();
    const id = res.headers.get('x-ebb-worker-id');
    assert.ok(workers.some((w) => w.worker_id === id), `x-ebb-worker-id ${id} names a worker`);
  });
});

describe('metrics an alert watches exist at 0 before their first event', () => {
  it('worker: refusals, request outcomes, transitions, shutdown stages; frontend: migrations and migration failures', async () => {
    const worker = await fetch(`${workers[1]!.system_url}/metrics`).then((r) => r.text());
    assert.equal(sample(worker, 'ebb_worker_admission_refusals_total', { code: 'worker_draining' }), 0);
    assert.equal(sample(worker, 'ebb_worker_admission_refusals_total', { code: 'worker_overloaded' }), 0);
    assert.equal(sample(worker, 'ebb_worker_requests_total', { outcome: 'handed_off' }), 0);
    assert.equal(sample(worker, 'ebb_worker_requests_total', { outcome: 'dropped' }), 0);
    assert.equal(sample(worker, 'ebb_worker_transitions_total', { from: 'serving', to: 'draining' }), 0);
    assert.equal(sample(worker, 'ebb_worker_transitions_total', { from: 'stopping', to: 'stopped' }), 0);
    assert.equal(sample(worker, 'ebb_worker_shutdown_stage_seconds_count', { stage: 'handoff', result: 'timed_out' }), 0);
    assert.equal(sample(worker, 'ebb_worker_shutdown_stage_seconds_count', { stage: 'wait_inflight', result: 'completed' }), 0);
    const frontend = await fetch(`${apiUrl}/metrics`).then((r) => r.text());
    for (const reason of ['worker_failed', 'worker_unresponsive', 'handoff']) assert.equal(sample(frontend, 'ebb_frontend_migrations_total', { reason }), 0, reason);
    for (const reason of ['no_worker', 'limit', 'error']) assert.equal(sample(frontend, 'ebb_frontend_migration_failures_total', { reason }), 0, reason);
  });
});

describe('when `ebb up` stops', () => {
  it('its readable log lines named the worker each came from; the commands no longer find its fleet', async () => {
    up.signal('SIGTERM');
    assert.equal(await up.exitCode(), 0);
    const lines = up.logs.map((l) => String(l.msg));
    assert.deepEqual(lines.filter((l) => / INFO worker: /.test(l)), [], 'no worker line without its worker');
    for (const w of workers) {
      const own = lines.filter((l) => l.includes(` worker ${w.worker_id}: `));
      assert.ok(own.some((l) => /shutdown/.test(l)), `${w.worker_id}'s shutdown lines name it: ${own.join('\n')}`);
    }
    assert.equal(existsSync(join(runtime, 'ebb', `up-${up.pid}.json`)), false, 'its state file is gone');
    const after = await ebb('workers');
    assert.equal(after.code, 0, after.stderr);
    assert.match(after.stdout, /^no workers in discovery at file:\/\//);
  });
});
