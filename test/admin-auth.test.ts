import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { call } from './helpers/http.js';
import { openEventStream } from './helpers/event-stream.js';
import { runEbb, spawnEbb, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle } from './helpers/processes.js';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

/** No admin token inherited from the environment running the tests. */
const NO_TOKEN = { EBB_ADMIN_TOKEN: undefined };
const bearer = (token: string) => ({ authorization: `Bearer ${token}` });

function tokenFile(token: string): string {
  const path = join(mkdtempSync(join(tmpdir(), 'ebb-test-token-')), 'admin-token');
  writeFileSync(path, `${token}\n`, { mode: 0o600 });
  return path;
}

async function withAdmin(discovery: string, args: string[] = []): Promise<FrontendHandle & { adminUrl: string }> {
  const fe = await startFrontend(discovery, ['--admin-port', '0', ...args]);
  started.push(fe);
  const ready = await fe.waitForEvent('frontend_ready');
  assert.equal(typeof ready.admin_url, 'string', 'frontend_ready names its admin url');
  return Object.assign(fe, { adminUrl: ready.admin_url as string });
}

/** The frontend routes to `id`: listed in its first view (discovery_reset) or added later. */
function sees(fe: EbbProcess, id: string) {
  return fe.waitForLog(
    (l) => (l.event === 'worker_added' && l.worker_id === id) || (l.event === 'discovery_reset' && (l.workers as string[]).includes(id)),
    `frontend sees ${id}`,
  );
}

describe('admin auth: worker Admin API', () => {
  it('needs the bearer token (env EBB_ADMIN_TOKEN) on drain and resume: 401 without, 403 wrong; probes and /metrics stay open', async () => {
    const w = await startWorker(['--discovery', tempDiscoveryUrl(), '--mocker-lora', 'a1', '--mocker-lora-load-ms', '0'], { EBB_ADMIN_TOKEN: 'tok-from-env' });
    started.push(w);

    const missing = await call('POST', `${w.systemUrl}/engine/drain`);
    assert.equal(missing.status, 401);
    assert.match(missing.headers.get('www-authenticate') ?? '', /^Bearer\b/);
    assert.equal(missing.body.error.code, 'unauthorized');
    const basic = await call('POST', `${w.systemUrl}/engine/drain`, undefined, { authorization: 'Basic dXNlcjpwYXNz' });
    assert.equal(basic.status, 401, 'a non-Bearer scheme is no credential');
    const wrong = await call('POST', `${w.systemUrl}/engine/drain`, undefined, bearer('tok-from-env-but-longer'));
    assert.equal(wrong.status, 403);
    assert.equal(wrong.body.error.code, 'forbidden');
    assert.equal(typeof wrong.body.error.message, 'string');
    assert.equal((await call('POST', `${w.systemUrl}/engine/resume`)).status, 401);
    // The adapter routes (issue 37) sit behind the same guard.
    for (const action of ['drain', 'unload', 'load']) {
      assert.equal((await call('POST', `${w.systemUrl}/engine/adapters/a1/${action}`)).status, 401, `adapter ${action} without the token`);
      assert.equal((await call('POST', `${w.systemUrl}/engine/adapters/a1/${action}`, undefined, bearer('nope'))).status, 403, `adapter ${action} with a wrong token`);
    }
    assert.equal((await call('GET', `${w.systemUrl}/engine/status`, undefined, bearer('tok-from-env'))).body.adapters[0].state, 'unloaded', 'refused adapter calls changed nothing');
    const loaded = await call('POST', `${w.systemUrl}/engine/adapters/a1/load`, undefined, bearer('tok-from-env'));
    assert.equal(loaded.body.state, 'serving');

    for (const path of ['/live', '/health', '/metrics']) {
      const res = await call('GET', `${w.systemUrl}${path}`);
      assert.equal(res.status, 200, `${path} stays open`);
    }
    assert.equal((await call('GET', `${w.systemUrl}/live`)).body.worker_id, w.workerId, '/live says who answers (a caller proves it before it sends a token)');
    assert.equal((await call('GET', `${w.systemUrl}/engine/status`, undefined, bearer('tok-from-env'))).body.state, 'serving', 'refused calls changed nothing');

    const drained = await call('POST', `${w.systemUrl}/engine/drain`, { reason: 'auth test' }, bearer('tok-from-env'));
    assert.ok(drained.status === 200 || drained.status === 202, `got ${drained.status}`);
    assert.ok(['draining', 'drained'].includes(drained.body.state));
    const resumed = await call('POST', `${w.systemUrl}/engine/resume`, undefined, bearer('tok-from-env'));
    assert.equal(resumed.status, 200);
    assert.equal(resumed.body.state, 'serving');
  });

  it('needs the token on every read of what the worker holds (status, audit, event streams): 401 without, 403 wrong; the admin or the request-plane token opens them', async () => {
    const env = { EBB_ADMIN_TOKEN: undefined, EBB_REQUEST_TOKEN: undefined };
    const w = await startWorker(['--discovery', tempDiscoveryUrl(), '--admin-token-file', tokenFile('read-admin-tok'), '--request-token-file', tokenFile('read-request-tok')], env);
    started.push(w);
    for (const path of ['/engine/status', '/engine/events', '/engine/status/events', '/kv/events']) {
      const missing = await call('GET', `${w.systemUrl}${path}`);
      assert.equal(missing.status, 401, `GET ${path} without the token`);
      assert.equal(missing.body.error.code, 'unauthorized');
      assert.match(missing.headers.get('www-authenticate') ?? '', /^Bearer\b/);
      const wrong = await call('GET', `${w.systemUrl}${path}`, undefined, bearer('not-a-token'));
      assert.equal(wrong.status, 403, `GET ${path} with a wrong token`);
      assert.equal(wrong.body.error.code, 'forbidden');
    }
    for (const token of ['read-admin-tok', 'read-request-tok']) {
      const status = await call('GET', `${w.systemUrl}/engine/status`, undefined, bearer(token));
      assert.equal(status.status, 200, `GET /engine/status with the ${token}`);
      assert.equal(status.body.worker_id, w.workerId);
      const audit = await call('GET', `${w.systemUrl}/engine/events`, undefined, bearer(token));
      assert.equal(audit.status, 200, `GET /engine/events with the ${token}`);
      assert.ok(Array.isArray(audit.body.events));
    }
    const stream = await openEventStream(`${w.systemUrl}/engine/status/events`, bearer('read-admin-tok'));
    try {
      assert.equal((await stream.waitFor((e) => e.event === 'status', 'the first status')).data.worker_id, w.workerId);
    } finally {
      stream.close();
    }
    // A typo'd path is no way around it.
    assert.equal((await call('GET', `${w.systemUrl}/engine/statu`)).status, 401);
  });

  it('the CLI reads a guarded worker found in discovery with its --token-file, once its open /live said it is that worker', async () => {
    const discovery = tempDiscoveryUrl();
    const file = tokenFile('cli-read-tok');
    const w = await startWorker(['--discovery', discovery, '--admin-token-file', file], NO_TOKEN);
    started.push(w);
    const without = await runEbb(['workers', '--discovery', discovery, '--json'], NO_TOKEN);
    assert.equal(without.code, 0, without.stderr);
    const unread = (JSON.parse(without.stdout) as { workers: Array<{ reachable: boolean; error?: string }> }).workers[0];
    assert.equal(unread?.reachable, false);
    assert.match(unread?.error ?? '', /HTTP 401/);
    const listed = await runEbb(['workers', '--discovery', discovery, '--json', '--token-file', file], NO_TOKEN);
    assert.equal(listed.code, 0, listed.stderr);
    assert.equal((JSON.parse(listed.stdout) as { workers: Array<{ state: string }> }).workers[0]?.state, 'serving');
    const status = await runEbb(['status', w.workerId, '--discovery', discovery, '--token-file', file], NO_TOKEN);
    assert.equal(status.code, 0, status.stderr);
    assert.match(status.stdout, new RegExp(`^worker ${w.workerId}: serving`));
  });

  it('takes the token from --admin-token-file, which allows a non-loopback --system-host', async () => {
    const file = tokenFile('tok-from-file');
    const w = await startWorker(['--discovery', tempDiscoveryUrl(), '--system-host', '0.0.0.0', '--admin-token-file', file], NO_TOKEN);
    started.push(w);
    const systemUrl = w.systemUrl.replace('//0.0.0.0:', '//127.0.0.1:');
    assert.equal((await call('POST', `${systemUrl}/engine/drain`)).status, 401);
    assert.equal((await call('POST', `${systemUrl}/engine/drain`, undefined, bearer('tok-from-env'))).status, 403);
    const ok = await call('POST', `${systemUrl}/engine/drain`, undefined, bearer('tok-from-file'));
    assert.ok(ok.status === 200 || ok.status === 202, `got ${ok.status}`);
  });
});

describe('admin auth: refused binds', () => {
  it('a worker refuses a non-loopback --system-host without a token: one clear line, non-zero exit, never registers', async () => {
    const discovery = tempDiscoveryUrl();
    const p = spawnEbb(['worker', '--port', '0', '--system-port', '0', '--discovery', discovery, '--system-host', '0.0.0.0'], 'worker', NO_TOKEN);
    started.push(p);
    const code = await p.exitCode();
    assert.notEqual(code, 0);
    assert.equal(p.stderr.length, 1, `one line: ${p.stderr.join('\n')}`);
    assert.match(p.stderr[0] ?? '', /^ebb: refusing .*0\.0\.0\.0 \(--system-host\) without an admin token: set --admin-token-file PATH or EBB_ADMIN_TOKEN/);
    assert.equal(p.indexOfEvent('worker_ready'), -1);
    assert.deepEqual(readdirSync(fileURLToPath(discovery)).filter((n) => n.endsWith('.json')), [], 'nothing registered');
  });

  it('a frontend refuses a non-loopback --admin-host without a token', async () => {
    const p = spawnEbb(['frontend', '--port', '0', '--admin-port', '0', '--discovery', tempDiscoveryUrl(), '--admin-host', '0.0.0.0'], 'frontend', NO_TOKEN);
    started.push(p);
    assert.notEqual(await p.exitCode(), 0);
    assert.equal(p.stderr.length, 1, `one line: ${p.stderr.join('\n')}`);
    assert.match(p.stderr[0] ?? '', /^ebb: refusing .*0\.0\.0\.0 \(--admin-host\) without an admin token/);
    assert.equal(p.indexOfEvent('frontend_ready'), -1);
  });

  it('an unreadable or empty token file is an error at start, not an open Admin API', async () => {
    const empty = join(mkdtempSync(join(tmpdir(), 'ebb-test-token-')), 'empty');
    writeFileSync(empty, '\n');
    const cases: Array<[string[], RegExp]> = [
      [['--admin-token-file', empty], /admin token file .* is empty/],
      [['--admin-token-file', join(tmpdir(), 'ebb-no-such-dir', 'token')], /cannot read admin token file .*: ENOENT/],
    ];
    for (const [args, message] of cases) {
      const p = spawnEbb(['worker', '--port', '0', '--system-port', '0', '--discovery', tempDiscoveryUrl(), ...args], 'worker', NO_TOKEN);
      started.push(p);
      assert.notEqual(await p.exitCode(), 0);
      assert.match(p.stderr.join('\n'), message);
    }
  });
});

describe('admin auth: frontend admin listener', () => {
  it('serves admin routes only on the admin listener; with a token, guards drain/resume and forwards the header', async () => {
    const discovery = tempDiscoveryUrl();
    const w = await startWorker(['--discovery', discovery, '--model', 'm1'], { EBB_ADMIN_TOKEN: 'shared-tok' });
    started.push(w);
    const fe = await withAdmin(discovery, ['--admin-token-file', tokenFile('shared-tok')]);
    await sees(fe, w.workerId);
    assert.notEqual(fe.adminUrl, fe.url);

    // The public OpenAI port has no admin route at all.
    for (const [method, path] of [
      ['GET', '/workers'],
      ['GET', `/workers/${w.workerId}`],
      ['POST', `/workers/${w.workerId}/drain`],
      ['POST', `/workers/${w.workerId}/resume`],
      ['POST', '/engine/drain'],
      ['GET', '/engine/status'],
    ] as const) {
      const res = await call(method, `${fe.url}${path}`, undefined, bearer('shared-tok'));
      assert.equal(res.status, 404, `${method} ${path} on the public port`);
      assert.equal(res.body.error.code, 'not_found');
    }

    // Reads need the token too (issue 49): the fleet view names every worker and its internal URLs.
    for (const path of ['/workers', `/workers/${w.workerId}`, '/workers/w-nobody', '/workers/events']) {
      const missing = await call('GET', `${fe.adminUrl}${path}`);
      assert.equal(missing.status, 401, `GET ${path} without the token`);
      assert.equal(missing.body.error.code, 'unauthorized');
      assert.match(missing.headers.get('www-authenticate') ?? '', /^Bearer\b/);
      assert.equal((await call('GET', `${fe.adminUrl}${path}`, undefined, bearer('nope'))).status, 403, `GET ${path} with a wrong token`);
    }
    // The dashboard's page loads, without the fleet; what it reads next needs the token.
    const page = await fetch(`${fe.adminUrl}/`);
    const html = await page.text();
    assert.equal(page.status, 200);
    assert.ok(!html.includes(w.workerId) && !html.includes(w.systemUrl), 'the page carries no worker');
    assert.deepEqual((await call('GET', `${fe.adminUrl}/dashboard/info`)).body, { admin_auth: 'bearer', writable: true });

    const list = await call('GET', `${fe.adminUrl}/workers`, undefined, bearer('shared-tok'));
    assert.equal(list.status, 200);
    assert.deepEqual(list.body.workers.map((x: { worker_id: string }) => x.worker_id), [w.workerId]);
    // The frontend read the worker's status with its own token (the worker's reads need it).
    assert.equal(list.body.workers[0].reachable, true, JSON.stringify(list.body.workers[0]));
    assert.equal(list.body.workers[0].state, 'serving');
    assert.equal((await call('GET', `${fe.adminUrl}/workers/${w.workerId}`, undefined, bearer('shared-tok'))).body.state, 'serving');
    const fleet = await openEventStream(`${fe.adminUrl}/workers/events`, bearer('shared-tok'));
    try {
      const snapshot = await fleet.waitFor((e) => e.event === 'snapshot', 'the fleet snapshot');
      assert.deepEqual(snapshot.data.workers.map((x: { worker_id: string }) => x.worker_id), [w.workerId]);
    } finally {
      fleet.close();
    }

    const drainUrl = `${fe.adminUrl}/workers/${w.workerId}/drain`;
    const missing = await call('POST', drainUrl);
    assert.equal(missing.status, 401);
    assert.match(missing.headers.get('www-authenticate') ?? '', /^Bearer\b/);
    const wrong = await call('POST', drainUrl, undefined, bearer('nope'));
    assert.equal(wrong.status, 403);
    assert.equal((await call('GET', `${w.systemUrl}/engine/status`, undefined, bearer('shared-tok'))).body.state, 'serving', 'refused at the frontend, never reached the worker');

    const unknown = await call('POST', `${fe.adminUrl}/workers/w-nobody/drain`, undefined, bearer('shared-tok'));
    assert.equal(unknown.status, 404);
    assert.equal(unknown.body.error.code, 'worker_not_found');
    const wrongMethod = await call('GET', drainUrl, undefined, bearer('shared-tok'));
    assert.equal(wrongMethod.status, 405);
    assert.equal(wrongMethod.headers.get('allow'), 'POST');
    assert.equal((await call('DELETE', `${fe.adminUrl}/workers`)).status, 405);

    // Forwarded with the header: the worker, which holds the same token, accepts it.
    const drained = await call('POST', drainUrl, { reason: 'via frontend' }, bearer('shared-tok'));
    assert.ok(drained.status === 200 || drained.status === 202, `got ${drained.status}: ${JSON.stringify(drained.body)}`);
    assert.equal(drained.body.drain_reason, 'via frontend');
    await w.waitForEvent('state_changed', (l) => l.to === 'drained');
    const resumed = await call('POST', `${fe.adminUrl}/workers/${w.workerId}/resume`, undefined, bearer('shared-tok'));
    assert.equal(resumed.status, 200);
    assert.equal(resumed.body.state, 'serving');
  });

  it('without a token of its own, the frontend passes the Authorization header through and the worker decides', async () => {
    const discovery = tempDiscoveryUrl();
    const w = await startWorker(['--discovery', discovery], { EBB_ADMIN_TOKEN: 'worker-tok' });
    started.push(w);
    const fe = await withAdmin(discovery);
    await sees(fe, w.workerId);
    const drainUrl = `${fe.adminUrl}/workers/${w.workerId}/drain`;
    const missing = await call('POST', drainUrl);
    assert.equal(missing.status, 401, 'the worker said 401, the frontend relays it');
    assert.match(missing.headers.get('www-authenticate') ?? '', /^Bearer\b/);
    assert.equal((await call('POST', drainUrl, undefined, bearer('other'))).status, 403);
    const ok = await call('POST', drainUrl, undefined, bearer('worker-tok'));
    assert.ok(ok.status === 200 || ok.status === 202, `got ${ok.status}`);
  });
});
