import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync } from 'node:fs';
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

describe('worker: loading its engine', () => {
  it('while loading: /live 200, /health 503 loading, Admin API 503 worker_loading, not in discovery; SIGTERM stops the load, exit 0', async () => {
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
    assert.deepEqual(records(discovery), [], 'not in discovery while loading');
    w.signal('SIGTERM');
    assert.equal(await w.exitCode(), 0);
    await w.waitForEvent('shutdown_during_loading');
    assert.equal(w.indexOfEvent('worker_ready'), -1, 'never ready');
    assert.deepEqual(records(discovery), [], 'never registered');
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
