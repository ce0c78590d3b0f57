import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { pino } from 'pino';
import { listen } from '../src/common/http-server.js';
import { Admission } from '../src/lifecycle/admission.js';
import { Lifecycle } from '../src/lifecycle/lifecycle.js';
import { WorkerPhase } from '../src/worker/phase.js';
import { createSystemServer } from '../src/worker/system-server.js';
import { call, openLineStream } from './helpers/http.js';
import { spawnEbb, tempDiscoveryUrl, type EbbProcess } from './helpers/processes.js';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

function loadingWorker(discovery: string, loadMs: number): EbbProcess {
  const p = spawnEbb(['worker', '--port', '0', '--system-port', '0', '--discovery', discovery, '--model', 'm1', '--mocker-load-ms', String(loadMs)], 'worker');
  started.push(p);
  return p;
}

const records = (discovery: string) => readdirSync(fileURLToPath(discovery)).filter((f) => f.endsWith('.json'));
/** What each record file holds (a serving or a loading record). */
const contents = (discovery: string) => records(discovery).map((f) => JSON.parse(readFileSync(join(fileURLToPath(discovery), f), 'utf8')).record as Record<string, unknown>);

describe('worker: loading its engine', () => {
  it('while loading: /live 200, /health 503 loading, Admin API 503 worker_loading, registered as loading only (no request URL); SIGTERM stops the load and withdraws that record, exit 0', async () => {
    const discovery = tempDiscoveryUrl();
    const w = loadingWorker(discovery, 600_000); // a load that only the SIGTERM below ends
    const loading = await w.waitForEvent('worker_loading');
    const system = loading.system_url as string;
    const live = await call('GET', `${system}/live`);
    assert.equal(live.status, 200);
    assert.equal(live.body.state, 'loading');
    const health = await call('GET', `${system}/health`);
    assert.equal(health.status, 503);
    assert.equal(health.body.state, 'loading');
    const status = await call('GET', `${system}/engine/status`);
    assert.equal(status.status, 503);
    assert.equal(status.body.error.code, 'worker_loading');
    assert.equal(status.body.error.retryable, true);
    assert.equal((await call('POST', `${system}/engine/drain`)).body.error.code, 'worker_loading');
    assert.match(await fetch(`${system}/metrics`).then((r) => r.text()), /^ebb_worker_loading 1$/m);
    const announced = await w.waitForEvent('loading_announced');
    assert.equal(announced.registered, true);
    const [record] = contents(discovery);
    assert.equal(contents(discovery).length, 1);
    assert.equal(record?.worker_id, loading.worker_id);
    assert.equal(record?.system_url, system);
    assert.equal(record?.model, 'm1');
    assert.equal(typeof (record?.loading as { since?: unknown } | undefined)?.since, 'string');
    assert.equal(record?.request_url, undefined, 'loading: nothing may be sent to it yet');
    w.signal('SIGTERM');
    assert.equal(await w.exitCode(), 0);
    await w.waitForEvent('shutdown_during_loading');
    assert.equal(w.indexOfEvent('worker_ready'), -1, 'never ready');
    assert.deepEqual(records(discovery), [], 'its loading record withdrawn, never a serving one');
  });

  it('registers once loaded, on the system server it answered from while loading', async () => {
    const discovery = tempDiscoveryUrl();
    const w = loadingWorker(discovery, 200);
    const loading = await w.waitForEvent('worker_loading');
    const ready = await w.waitForEvent('worker_ready');
    assert.equal(ready.system_url, loading.system_url);
    assert.ok(w.indexOfEvent('worker_loading') < w.indexOfEvent('worker_ready'));
    assert.equal((await call('GET', `${ready.system_url as string}/health`)).status, 200);
    assert.equal(records(discovery).length, 1);
    assert.equal(contents(discovery)[0]?.request_url, ready.request_url, 'the serving record replaced the loading one');
    assert.equal(contents(discovery)[0]?.loading, undefined);
  });
});

describe('worker: its engine dies', () => {
  it('leaves discovery, ends the stream in flight with an explicit error, and exits non-zero', async () => {
    const discovery = tempDiscoveryUrl();
    const w = spawnEbb(['worker', '--port', '0', '--system-port', '0', '--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '20', '--mocker-fail-on-prompt', 'die now'], 'worker');
    started.push(w);
    const ready = await w.waitForEvent('worker_ready');
    assert.equal(records(discovery).length, 1);
    const long = await openLineStream(`${ready.request_url as string}/generate`, { model: 'm1', prompt: 'a long answer', max_tokens: 100_000 });
    assert.equal(long.status, 200);
    await long.first;
    const trigger = await call('POST', `${ready.request_url as string}/generate`, { model: 'm1', prompt: 'die now', stream: false });
    assert.equal(trigger.status, 500);
    assert.equal(await w.exitCode(), 1);
    const failed = await w.waitForEvent('engine_failed');
    assert.match(failed.err as string, /simulated engine failure/);
    const lines = (await long.done).map((l) => JSON.parse(l));
    assert.ok(lines.at(-1)?.error, `the stream ends with an error line, not a silent cut: ${JSON.stringify(lines.at(-1))}`);
    assert.deepEqual(records(discovery), [], 'unregistered before exiting');
  });

  it('/live and /health read the failure from the lifecycle: 503 engine_failed with its message, from failed on', async () => {
    const lifecycle = new Lifecycle('w-test', new Admission(), undefined, { register: async () => undefined, unregister: async () => undefined }, pino({ level: 'silent' }));
    const app = createSystemServer({ phase: new WorkerPhase(lifecycle), workerId: 'w-test' });
    after(() => app.close());
    const system = await listen(app, '127.0.0.1', 0);
    assert.equal((await call('GET', `${system}/live`)).status, 200, 'alive while loading');
    assert.equal(lifecycle.engineFailed('the engine process exited (code 137)'), true);
    const live = await call('GET', `${system}/live`);
    assert.equal(live.status, 503);
    assert.deepEqual(live.body, { status: 'engine_failed', state: 'failed', reason: 'the engine process exited (code 137)', worker_id: 'w-test' });
    assert.equal((await call('GET', `${system}/health`)).status, 503);
    lifecycle.stopped();
    assert.equal((await call('GET', `${system}/live`)).body.reason, 'the engine process exited (code 137)', 'still failed once stopped');
  });
});
