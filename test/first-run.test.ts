import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { call, openLineStream, type JsonResponse } from './helpers/http.js';
import { CLI, metricValues, spawnEbb, START_BOUND_MS, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { skipWithout } from './helpers/required-tool.js';
import { etcdSkipReason } from './helpers/etcd.js';

const started: EbbProcess[] = [];
after(async () => {
  // SIGTERM first: `ebb up` stops the components it started (its children are in their own process groups).
  await Promise.all(started.map((p) => p.terminate()));
});

const ebbSync = (args: string[]) => spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8', timeout: 30_000 });

function up(args: string[]): EbbProcess {
  const p = spawnEbb(['up', '--port', '0', '--mocker-itl-ms', '0', ...args], 'ebb up');
  started.push(p);
  return p;
}

/**
 * One worker behind one frontend, shared by the tests below (health, metrics, log format, and last
 * the worker's shutdown); the frontends' /health is read before the worker exists.
 */
let fleet: Promise<{ fe: FrontendHandle; w: WorkerHandle; empty: JsonResponse; lenient: JsonResponse }> | undefined;
function oneWorkerFleet() {
  return (fleet ??= (async () => {
    const discovery = tempDiscoveryUrl();
    const fe = await startFrontend(discovery);
    started.push(fe);
    const empty = await call('GET', `${fe.url}/health`);
    const lenientFe = await startFrontend(discovery, ['--health-ready-without-workers']);
    started.push(lenientFe);
    const lenient = await call('GET', `${lenientFe.url}/health`);
    await lenientFe.stop();
    // The shutdown flags are for the last test: a *-ms flag given with a unit.
    const w = await startWorker(['--discovery', discovery, '--model', 'm1', '--drain-timeout-ms', '2s', '--shutdown-grace-ms', '0s']);
    started.push(w);
    await fe.waitForEvent('worker_added', (l) => l.worker_id === w.workerId);
    return { fe, w, empty, lenient };
  })());
}

describe('first run: durations', () => {
  it('refuses a bare number where a duration is expected, saying the form; *-ms flags take units too', () => {
    const bare = ebbSync(['drain', 'http://127.0.0.1:9', '--wait', '--timeout', '30']);
    assert.notEqual(bare.status, 0);
    assert.match(bare.stderr, /expected a duration with a unit, like 500ms, 30s or 10m, got "30"/);
    const unit = ebbSync(['worker', '--drain-timeout-ms', 'soon']);
    assert.match(unit.stderr, /expected milliseconds .* or a duration like 500ms, 30s, got "soon"/);
  });
});

describe('first run: metrics', () => {
  const promtool = spawnSync('promtool', ['--version']).status === 0;
  it('worker and frontend metrics pass promtool check metrics, with standard process metric names', { skip: skipWithout(promtool, 'promtool not installed: the metrics check SKIPPED; apt-get install prometheus') }, async () => {
    const { w, fe } = await oneWorkerFleet();
    await call('POST', `${fe.url}/v1/completions`, { model: 'm1', prompt: 'x', max_tokens: 2 });
    for (const url of [w.systemUrl, fe.url]) {
      const text = await fetch(`${url}/metrics`).then((r) => r.text());
      assert.match(text, /^process_cpu_seconds_total /m, 'standard name, no ebb_*_process_ prefix');
      assertPromtoolClean(text, `${url}/metrics`);
    }
  });

  it("a worker's /metrics carries the picker gauges under vLLM's names and meaning: running, waiting for a batch slot, KV blocks held by running requests", { skip: skipWithout(promtool, 'promtool not installed: the metrics check SKIPPED; apt-get install prometheus') }, async () => {
    const w = await startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'picker-m', '--mocker-batch-slots', '1', '--mocker-itl-ms', '20', '--mocker-kv-blocks', '100', '--mocker-kv-block-size', '4']);
    started.push(w);
    const series = ['vllm:num_requests_running{model_name="picker-m"}', 'vllm:num_requests_waiting{model_name="picker-m"}', 'vllm:kv_cache_usage_perc{model_name="picker-m"}'];
    assert.deepEqual(await metricValues(w.systemUrl, series), [0, 0, 0], 'idle: every series there, at 0');
    // One stream runs (its prompt holds 2 full blocks) and one waits for the one batch slot.
    const body = { model: 'picker-m', prompt: 'one two three four five six seven eight nine', max_tokens: 5000, stream: true };
    const running = await openLineStream(`${w.requestUrl}/generate`, body);
    await running.first;
    const waiting = await openLineStream(`${w.requestUrl}/generate`, { ...body, prompt: 'another prompt' });
    // Its headers come after the worker queued it for the slot (the same turn of the worker's loop).
    const seen = await metricValues(w.systemUrl, series);
    assert.deepEqual(seen, [1, 1, 2 / 100], 'one running, one waiting, its 2 of 100 blocks in use');
    const text = await fetch(`${w.systemUrl}/metrics`).then((r) => r.text());
    assertPromtoolClean(text, 'the worker page with the picker gauges');
    running.abort();
    waiting.abort();
  });
});

/**
 * promtool check metrics passes the page, except its one lint on the `vllm:` names: Prometheus
 * keeps ':' for recording rules, but the pickers read vLLM's names as vLLM spells them.
 */
function assertPromtoolClean(text: string, what: string): void {
  const res = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
  const problems = `${res.stdout}${res.stderr}`.split('\n').filter((l) => l.trim() !== '');
  const others = problems.filter((l) => !/^vllm:[a-z_]+ metric names should not contain ':'$/.test(l));
  assert.ok(res.status === 0 || (res.status === 3 && others.length === 0), `promtool on ${what} (exit ${res.status}): ${others.join('\n')}`);
}

describe('first run: logs', () => {
  it('--log-format pretty prints lines a person reads; JSON stays the default on a pipe', async () => {
    const discovery = tempDiscoveryUrl();
    const pretty = spawnEbb(['--log-format', 'pretty', 'worker', '--port', '0', '--system-port', '0', '--discovery', discovery, '--model', 'm1'], 'worker');
    started.push(pretty);
    const line = await pretty.waitForLog((l) => typeof l.msg === 'string' && /worker w-\w+: worker w-\w+ ready/.test(l.msg), 'a readable ready line');
    assert.doesNotMatch(String(line.msg), /^\{/, 'not JSON');
    assert.match(String(line.msg), /^\[?\d\d:\d\d:\d\d\.\d{3}\]? INFO/);
    const { w: json } = await oneWorkerFleet();
    assert.equal(json.logs[0]?.component, 'worker', 'JSON lines when stdout is a pipe');
  });
});

describe('first run: ebb up', () => {
  it('restarts a worker that exits on its own, and its replacement registers; --metrics-sd-file follows it; Ctrl-C then drains, says it stopped, exits 0, and removes its temporary discovery directory', async () => {
    const sd = join(mkdtempSync(join(tmpdir(), 'ebb-sd-')), 'targets.json');
    const p = up(['--workers', '1', '--metrics-sd-file', sd]);
    const first = await p.waitForEvent('worker_ready');
    const fe = await p.waitForEvent('frontend_ready');
    const [, dir] = await p.waitForStderr(/ebb is up \(discovery (file:\/\/\S+)\)/);
    assert.ok(existsSync(fileURLToPath(dir!)));
    const targets = () => JSON.parse(readFileSync(sd, 'utf8')) as Array<{ targets: string[]; labels: Record<string, string> }>;
    assert.deepEqual(targets().map((t) => t.labels.job).sort(), ['ebb-frontend', 'ebb-worker']);
    const mark = p.mark();
    process.kill(first.pid as number, 'SIGKILL');
    const second = await p.waitForEvent('worker_ready', () => true, { after: mark });
    assert.notEqual(second.worker_id, first.worker_id);
    assert.match(p.stderr.join('\n'), /ebb up: aggregated-0 exited unexpectedly \(SIGKILL\); restarting it in 1s/);
    // The frontend routes to the replacement.
    await p.waitForLog((l) => l.event === 'worker_added' && l.worker_id === second.worker_id, 'frontend sees the replacement');
    assert.equal((await call('POST', `${fe.url as string}/v1/completions`, { model: 'ebb-mock', prompt: 'x', max_tokens: 2 })).status, 200);
    const worker = targets().find((t) => t.labels.job === 'ebb-worker');
    assert.equal(worker?.labels.worker_id, second.worker_id);
    assert.equal(`http://${worker?.targets[0]}`, second.system_url);

    p.signal('SIGINT');
    assert.equal(await p.exitCode(), 0);
    assert.match(p.stderr.join('\n'), /ebb up: stopped \(workers drained, frontend closed\)/);
    assert.equal(existsSync(fileURLToPath(dir!)), false, 'temporary discovery directory removed');
  });

  it('--no-restart reports the exit and leaves the worker down', async () => {
    const p = up(['--workers', '1', '--no-restart']);
    const w = await p.waitForEvent('worker_ready');
    await p.waitForStderr(/ebb is up/, START_BOUND_MS);
    process.kill(w.pid as number, 'SIGKILL');
    await p.waitForStderr(/ebb up: aggregated-0 exited \(SIGKILL\) and is not restarted \(--no-restart\)/);
    assert.equal(p.alive, true, 'ebb up itself goes on');
  });
});

describe('first run: the frontend says whether it can route', () => {
  it('/health is 503 with no worker, 200 with per-model counts once one serves; --health-ready-without-workers opts out', async () => {
    const { fe, empty, lenient } = await oneWorkerFleet();
    assert.equal(empty.status, 503);
    assert.equal(empty.body.can_route, false);
    assert.equal(lenient.status, 200);
    const ready = await call('GET', `${fe.url}/health`);
    assert.equal(ready.status, 200);
    assert.deepEqual(ready.body.models, { m1: { workers: 1, serving: 1 } });
  });
});

describe('first run: discovery that cannot be reached', () => {
  it('a worker retries its first registration, then exits naming the real cause', { skip: etcdSkipReason() }, async () => {
    // Nothing listens on this port: the cause is a refused connection, not a circuit breaker.
    const port = Number(execFileSync(process.execPath, ['-e', "const s=require('net').createServer().listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})"], { encoding: 'utf8' }).trim());
    const w = spawnEbb(['worker', '--port', '0', '--system-port', '0', '--discovery', `etcd://127.0.0.1:${port}`, '--model', 'm1', '--register-timeout-ms', '1500'], 'worker');
    started.push(w);
    await w.waitForEvent('discovery_register_retry');
    assert.equal(await w.exitCode(), 1);
    const stderr = w.stderr.join('\n');
    assert.match(stderr, /could not register in discovery etcd:\/\/127\.0\.0\.1:\d+ within 2 s/);
    assert.doesNotMatch(stderr, /Execution prevented/);
  });
});

describe('first run: durations, given to a running worker', () => {
  it('a *-ms flag given with a unit means what it says', async () => {
    // Last: the shared worker was started with --drain-timeout-ms 2s --shutdown-grace-ms 0s.
    const { w } = await oneWorkerFleet();
    w.signal('SIGTERM');
    assert.equal(await w.exitCode(), 0);
    const stages = (await w.waitForEvent('shutdown_complete')).stages as Array<{ stage: string }>;
    assert.ok(stages.length > 0);
  });
});
