import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { call } from './helpers/http.js';
import { startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';

/**
 * Event streams cannot lock out the Admin API. A worker's system port had one connection budget
 * (64) for everything, and its KV event stream alone was capped at 64: a fleet of frontends (one
 * subscription per process) or anyone holding 64 streams made drain, resume and status answer 503
 * listener_busy, also through the frontend. Now streams have a budget of their own, each stream is
 * capped, and with an admin token set the streams need it. Real worker and frontend processes.
 */
const TOKEN = 'tok-event-streams';
const bearer = { authorization: `Bearer ${TOKEN}` };
const started: EbbProcess[] = [];
/** Streams are held open on their own agent (no connection cap), closed at the end. */
const streams = new Agent({ connections: null, bodyTimeout: 0 });
let worker: WorkerHandle;
let frontend: FrontendHandle;
let frontendAdmin: string;

before(async () => {
  const dir = mkdtempSync(join(tmpdir(), 'ebb-test-token-'));
  const tokenFile = join(dir, 'admin-token');
  writeFileSync(tokenFile, `${TOKEN}\n`, { mode: 0o600 });
  const discovery = tempDiscoveryUrl();
  worker = await startWorker(['--discovery', discovery, '--model', 'm1', '--admin-token-file', tokenFile], { EBB_ADMIN_TOKEN: undefined });
  started.push(worker);
  // The frontend presents its own admin token to the worker's streams (no --worker-admin-token-file).
  frontend = await startFrontend(discovery, ['--router', 'kv', '--admin-port', '0', '--admin-token-file', tokenFile], { EBB_ADMIN_TOKEN: undefined, EBB_WORKER_ADMIN_TOKEN: undefined });
  started.push(frontend);
  frontendAdmin = (await frontend.waitForEvent('admin_ready')).url as string;
});

after(async () => {
  await streams.destroy();
  await Promise.all(started.map((p) => p.stop()));
});

/** Opens a stream and keeps it open; resolves with its status once the headers arrived. */
async function hold(url: string, headers: Record<string, string> = bearer): Promise<number> {
  const res = await request(url, { headers: { accept: 'text/event-stream', ...headers }, dispatcher: streams });
  if (res.statusCode !== 200) await res.body.text();
  return res.statusCode;
}

/** A stream request's answer: its status and, when it was refused, its error code (an opened stream is closed at once). */
async function answer(url: string, headers: Record<string, string> = {}): Promise<{ status: number; code?: string }> {
  const res = await request(url, { headers: { accept: 'text/event-stream', ...headers }, dispatcher: streams });
  if (res.statusCode === 200) {
    res.body.on('error', () => undefined).destroy();
    return { status: 200 };
  }
  return { status: res.statusCode, code: ((await res.body.json()) as { error?: { code?: string } }).error?.code };
}

describe("a worker's event streams", () => {
  it('need the admin token where the worker has one; the frontend presents it', async () => {
    for (const path of ['/kv/events', '/engine/status/events'])
      assert.deepEqual(await answer(`${worker.systemUrl}${path}`), { status: 401, code: 'unauthorized' }, `${path} without the token`);
    // The frontend's KV subscription, with the token it holds, delivered the worker's snapshot.
    await frontend.waitForEvent('kv_stream_connected', (l) => l.worker_id === worker.workerId);
  });

  it('leave drain, resume and status answering with every stream slot held, and refuse streams past their cap', async () => {
    // The frontend holds one KV stream already: 63 more fill that cap; 64 status streams fill the other.
    const kv = await Promise.all(Array.from({ length: 63 }, () => hold(`${worker.systemUrl}/kv/events`)));
    const status = await Promise.all(Array.from({ length: 64 }, () => hold(`${worker.systemUrl}/engine/status/events`)));
    assert.deepEqual([...new Set([...kv, ...status])], [200], 'every stream up to the caps opened');

    assert.deepEqual(await answer(`${worker.systemUrl}/kv/events`, bearer), { status: 503, code: 'listener_busy' }, 'a KV stream past the cap');

    // 127 streams open on the worker's system port; the Admin API answers as if there were none.
    const st = await call('GET', `${worker.systemUrl}/engine/status`, undefined, bearer);
    assert.equal(st.status, 200, `status: ${JSON.stringify(st.body)}`);
    const drained = await call('POST', `${worker.systemUrl}/engine/drain`, undefined, bearer);
    assert.equal(drained.status, 200, `drain: ${JSON.stringify(drained.body)}`);
    assert.equal(drained.body.state, 'drained');
    const resumed = await call('POST', `${worker.systemUrl}/engine/resume`, undefined, bearer);
    assert.equal(resumed.status, 200, `resume: ${JSON.stringify(resumed.body)}`);
    assert.equal(resumed.body.state, 'serving');

    // Through the frontend's admin API too (ebb drain --frontend): forwarded to the worker's Admin API.
    const viaFrontend = await call('POST', `${frontendAdmin}/workers/${worker.workerId}/drain`, undefined, bearer);
    assert.ok(viaFrontend.status === 200 || viaFrontend.status === 202, `drain through the frontend: ${viaFrontend.status} ${JSON.stringify(viaFrontend.body)}`);
    const back = await call('POST', `${frontendAdmin}/workers/${worker.workerId}/resume`, undefined, bearer);
    assert.equal(back.status, 200, `resume through the frontend: ${back.status} ${JSON.stringify(back.body)}`);
  });
});

describe("the frontend's fleet event streams", () => {
  it('leave its admin API answering with every stream slot held', async () => {
    const held = await Promise.all(Array.from({ length: 64 }, () => hold(`${frontendAdmin}/workers/events`)));
    assert.deepEqual([...new Set(held)], [200], 'every fleet stream up to the cap opened');
    assert.deepEqual(await answer(`${frontendAdmin}/workers/events`, bearer), { status: 503, code: 'listener_busy' }, 'a fleet stream past the cap');
    const workers = await call('GET', `${frontendAdmin}/workers`, undefined, bearer);
    assert.equal(workers.status, 200, `GET /workers: ${JSON.stringify(workers.body)}`);
    const drained = await call('POST', `${frontendAdmin}/workers/${worker.workerId}/drain`, undefined, bearer);
    assert.ok(drained.status === 200 || drained.status === 202, `drain through the frontend: ${drained.status} ${JSON.stringify(drained.body)}`);
  });
});

describe('a fleet whose frontend holds only the request-plane token', () => {
  it("opens the workers' event streams with it; a stranger's token is refused", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'ebb-test-token-'));
    const adminFile = join(dir, 'admin-token');
    const requestFile = join(dir, 'request-token');
    writeFileSync(adminFile, `${TOKEN}\n`, { mode: 0o600 });
    writeFileSync(requestFile, 'tok-request-plane\n', { mode: 0o600 });
    const discovery = tempDiscoveryUrl();
    const env = { EBB_ADMIN_TOKEN: undefined, EBB_REQUEST_TOKEN: undefined, EBB_WORKER_ADMIN_TOKEN: undefined };
    const w = await startWorker(['--discovery', discovery, '--model', 'm1', '--admin-token-file', adminFile, '--request-token-file', requestFile], env);
    started.push(w);
    assert.deepEqual(await answer(`${w.systemUrl}/kv/events`, { authorization: 'Bearer tok-request-plane' }), { status: 200 }, 'the request-plane token opens a stream');
    assert.deepEqual(await answer(`${w.systemUrl}/kv/events`, { authorization: 'Bearer someone-else' }), { status: 403, code: 'forbidden' }, "a stranger's token");
    const fe = await startFrontend(discovery, ['--router', 'kv', '--request-token-file', requestFile], env);
    started.push(fe);
    await fe.waitForEvent('kv_stream_connected', (l) => l.worker_id === w.workerId);
  });
});
