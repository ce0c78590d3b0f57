import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { connect, type Socket } from 'node:net';
import { once } from 'node:events';
import { call, openLineStream } from './helpers/http.js';
import { bounded, spawnEbb, START_BOUND_MS, startWorker, tempDiscoveryUrl, type WorkerHandle } from './helpers/processes.js';

const started: WorkerHandle[] = [];
after(async () => {
  await Promise.all(started.map((w) => w.stop()));
});

async function worker(args: string[] = [], env: NodeJS.ProcessEnv = {}): Promise<WorkerHandle & { discoveryDir: string }> {
  const url = tempDiscoveryUrl();
  const w = await startWorker(['--discovery', url, '--model', 'm1', ...args], env);
  started.push(w);
  return Object.assign(w, { discoveryDir: fileURLToPath(url) });
}

/** One serving worker for the cases that leave it as they found it (each checks that they did). */
let shared: Promise<WorkerHandle> | undefined;
const sharedWorker = (): Promise<WorkerHandle> => (shared ??= worker());

const gen = (w: WorkerHandle, body: Record<string, unknown> = {}) =>
  openLineStream(`${w.requestUrl}/generate`, { model: 'm1', prompt: 'tell me about tides', max_tokens: 20, ...body });

function tokensOf(lines: string[]): { tokens: number; last: any } {
  const parsed = lines.map((l) => JSON.parse(l));
  return { tokens: parsed.filter((p) => typeof p.text === 'string').length, last: parsed.at(-1) };
}

const registrationFile = (w: WorkerHandle & { discoveryDir: string }) => join(w.discoveryDir, `${w.workerId}.json`);

describe('worker process: drain, resume, admission', () => {
  it('closes admission before unregistering, then refuses new work with a retryable 503', async () => {
    const w = await worker();
    assert.ok(existsSync(registrationFile(w)), 'registered at start');
    const drain = await call('POST', `${w.systemUrl}/engine/drain`);
    assert.equal(drain.status, 200);
    assert.equal(drain.body.state, 'drained');
    assert.equal(drain.body.inflight_requests, 0);
    assert.ok(!existsSync(registrationFile(w)), 'unregistered');
    await w.waitForEvent('discovery_unregistered');
    const closed = w.indexOfEvent('admission_closed');
    const unregistered = w.indexOfEvent('discovery_unregistered');
    assert.ok(closed >= 0 && unregistered > closed, `admission_closed (${closed}) must precede discovery_unregistered (${unregistered})`);

    const refused = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'hi' });
    assert.equal(refused.status, 503);
    assert.equal(refused.body.error.code, 'worker_draining');
    assert.equal(refused.body.error.retryable, true);
    assert.equal(refused.headers.get('retry-after'), null, 'drained: nothing will change by itself, so no Retry-After');
    const health = await call('GET', `${w.systemUrl}/health`);
    assert.equal(health.status, 503);
    assert.equal(health.body.state, 'drained');
    assert.equal((await call('GET', `${w.systemUrl}/live`)).status, 200, '/live stays 200 while drained');
  });

  it('drains while 5 streams run: draining with 5 in flight, every token delivered, then drained', async () => {
    const w = await worker(['--mocker-itl-ms', '40']);
    const streams = await Promise.all(Array.from({ length: 5 }, (_, i) => gen(w, { seed: i, max_tokens: 25 })));
    await Promise.all(streams.map((s) => s.first));
    const drain = await call('POST', `${w.systemUrl}/engine/drain`);
    assert.equal(drain.status, 202);
    assert.equal(drain.body.state, 'draining');
    assert.equal(drain.body.inflight_requests, 5);
    assert.deepEqual(drain.body.waiting_for, ['5 in-flight requests']);
    const again = await call('POST', `${w.systemUrl}/engine/drain`);
    assert.equal(again.status, 202, 'drain is idempotent');
    assert.equal(again.body.generation, drain.body.generation, 'a repeated drain does not start a new cycle');

    const late = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'late' });
    assert.equal(late.status, 503);
    assert.equal(late.body.error.code, 'worker_draining');

    for (const s of streams) {
      const { tokens, last } = tokensOf(await s.done);
      assert.equal(tokens, 25);
      assert.equal(last.done, true);
      assert.equal(last.usage.completion_tokens, 25);
    }
    await w.waitForEvent('state_changed', (l) => l.to === 'drained');
    const status = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(status.body.state, 'drained');
    assert.equal(status.body.inflight_requests, 0);
  });

  it("a draining worker's refusal says when its drain ends: Retry-After from its ETA (here bounded by the drain's deadline)", async () => {
    const w = await worker(['--mocker-itl-ms', '40']);
    const s = await gen(w, { max_tokens: 2000 });
    await s.first;
    const drain = await call('POST', `${w.systemUrl}/engine/drain`, { deadline_ms: 30_000 });
    assert.equal(drain.body.state, 'draining');
    assert.equal(typeof drain.body.eta_ms, 'number', `an ETA while draining: ${JSON.stringify(drain.body)}`);
    const late = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'late' });
    assert.equal(late.body.error.code, 'worker_draining');
    const retryAfter = Number(late.headers.get('retry-after'));
    assert.ok(Number.isSafeInteger(retryAfter) && retryAfter >= 1 && retryAfter <= Math.ceil(drain.body.eta_ms / 1000), `Retry-After is the ETA in seconds (${late.headers.get('retry-after')}; eta ${drain.body.eta_ms} ms)`);
    assert.ok(retryAfter > 1, 'not the old constant 1 s: the stream has ~80 s left, the deadline 30 s');
    s.abort();
  });

  it('releases the slot of a client that disconnects mid-stream', async () => {
    const w = await worker(['--mocker-itl-ms', '50']);
    const s = await gen(w, { max_tokens: 10_000 });
    await s.first;
    const before = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(before.body.inflight_requests, 1);
    s.abort();
    const drain = await call('POST', `${w.systemUrl}/engine/drain`);
    if (drain.body.state !== 'drained') await w.waitForEvent('state_changed', (l) => l.to === 'drained');
    const status = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(status.body.state, 'drained');
    assert.equal(status.body.inflight_requests, 0);
    assert.equal(status.body.engine.running_sequences, 0);
    const metrics = await fetch(`${w.systemUrl}/metrics`).then((r) => r.text());
    assert.match(metrics, /ebb_worker_requests_total\{outcome="dropped"\} 1/);
  });

  it('resume returns to serving and registers again', async () => {
    const w = await worker();
    await call('POST', `${w.systemUrl}/engine/drain`);
    assert.ok(!existsSync(registrationFile(w)));
    const resumed = await call('POST', `${w.systemUrl}/engine/resume`);
    assert.equal(resumed.status, 200);
    assert.equal(resumed.body.state, 'serving');
    assert.equal(resumed.body.discovery_registered, true);
    assert.ok(existsSync(registrationFile(w)), 're-registered');
    assert.equal((await call('GET', `${w.systemUrl}/health`)).status, 200);
    const s = await gen(w, { max_tokens: 3 });
    assert.equal(tokensOf(await s.done).tokens, 3);
  });

  it('keeps drain cycles apart: work of an earlier cycle cannot end a later one early', async () => {
    const w = await worker(['--mocker-itl-ms', '30']);
    const a = await gen(w, { max_tokens: 15 });
    await a.first;
    const first = await call('POST', `${w.systemUrl}/engine/drain`);
    assert.equal(first.body.state, 'draining');
    await call('POST', `${w.systemUrl}/engine/resume`);
    const b = await gen(w, { max_tokens: 60 });
    await b.first;
    const beforeSecond = w.mark();
    const second = await call('POST', `${w.systemUrl}/engine/drain`);
    assert.equal(second.body.state, 'draining');
    assert.ok(second.body.generation > first.body.generation);
    assert.equal(tokensOf(await a.done).tokens, 15);
    const mid = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(mid.body.state, 'draining', 'stream A ending must not drain the cycle that B still holds');
    assert.equal(mid.body.inflight_requests, 1);
    assert.equal(tokensOf(await b.done).tokens, 60);
    const drained = await w.waitForEvent('state_changed', (l) => l.to === 'drained', { after: beforeSecond });
    assert.equal(drained.generation, second.body.generation);
  });

  it('stays draining when the engine cannot confirm idleness (fail-closed)', async () => {
    const w = await worker(['--mocker-idleness', 'unknown', '--drain-timeout-ms', '300']);
    const s = await gen(w, { max_tokens: 2 });
    await s.done;
    const drain = await call('POST', `${w.systemUrl}/engine/drain`);
    assert.equal(drain.status, 202);
    assert.equal(drain.body.state, 'draining');
    assert.equal(drain.body.inflight_requests, 0);
    assert.match(drain.body.waiting_for.join(' '), /idleness unknown/);
    const status = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(status.body.state, 'draining');
    // Not one instant: to the end of the process, through SIGTERM's deadline, it never drains.
    w.signal('SIGTERM');
    assert.equal(await w.exitCode(), 1);
    const waited = await w.waitForEvent('shutdown_stage', (l) => l.stage === 'wait_inflight');
    assert.equal(waited.outcome, 'unsupported');
    assert.ok(!w.logs.some((l) => l.to === 'drained'), 'never a false drained');
  });

  it('answers 404, 405 with Allow, and 400 as JSON', async () => {
    const w = await sharedWorker();
    const notFound = await call('GET', `${w.systemUrl}/nope`);
    assert.equal(notFound.status, 404);
    assert.equal(notFound.body.error.code, 'not_found');
    const wrong = await call('GET', `${w.systemUrl}/engine/drain`);
    assert.equal(wrong.status, 405);
    assert.equal(wrong.headers.get('allow'), 'POST');
    assert.equal(wrong.body.error.code, 'method_not_allowed');
    const wrongStatus = await call('POST', `${w.systemUrl}/engine/status`);
    assert.equal(wrongStatus.status, 405);
    assert.equal(wrongStatus.headers.get('allow'), 'GET');
    const badJson = await call('POST', `${w.systemUrl}/engine/drain`, '{oops');
    assert.equal(badJson.status, 400);
    assert.equal(badJson.body.error.code, 'invalid_request');
    const badBody = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', max_tokens: 'many' });
    assert.equal(badBody.status, 400);
    const noPrompt = await call('POST', `${w.requestUrl}/generate`, { model: 'm1' });
    assert.equal(noPrompt.status, 400);
    const otherModel = await call('POST', `${w.requestUrl}/generate`, { model: 'other', prompt: 'x' });
    assert.equal(otherModel.status, 404);
    assert.equal(otherModel.body.error.code, 'model_not_found');
    assert.equal((await call('GET', `${w.systemUrl}/engine/status`)).body.state, 'serving', 'bad calls change nothing');
  });

  it('produces the same text for the same seed', async () => {
    const w = await sharedWorker();
    const one = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'same', seed: 7, max_tokens: 8, stream: false });
    const two = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'same', seed: 7, max_tokens: 8, stream: false });
    assert.equal(one.status, 200);
    assert.equal(one.body.text, two.body.text);
    assert.equal(one.body.usage.completion_tokens, 8);
  });
});

describe('worker process: SIGTERM', () => {
  it('lets in-flight streams finish, refuses new work, then exits 0', async () => {
    const w = await worker(['--mocker-itl-ms', '30', '--shutdown-grace-ms', '200']);
    const streams = await Promise.all([0, 1, 2].map((i) => gen(w, { seed: i, max_tokens: 30 })));
    await Promise.all(streams.map((s) => s.first));
    w.signal('SIGTERM');
    await w.waitForEvent('shutdown_started');
    const late = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'late' });
    assert.equal(late.status, 503);
    assert.equal(late.body.error.code, 'worker_draining');
    for (const s of streams) assert.equal(tokensOf(await s.done).tokens, 30);
    assert.equal(await w.exitCode(), 0);
    assert.ok(!existsSync(registrationFile(w)));
  });

  it('exits promptly after an Admin drain: the grace is skipped', async () => {
    // A 10-minute grace: this test only finishes if SIGTERM skips it.
    const w = await worker(['--shutdown-grace-ms', '600000']);
    const drain = await call('POST', `${w.systemUrl}/engine/drain`);
    assert.equal(drain.body.state, 'drained');
    w.signal('SIGTERM');
    assert.equal(await w.exitCode(), 0);
    const done = await w.waitForEvent('shutdown_complete');
    assert.equal(done.exit_code, 0);
  });

  it('refuses resume with 409 while shutting down, still answers status, and a second SIGTERM exits at once', async () => {
    const w = await worker(['--mocker-itl-ms', '50', '--shutdown-grace-ms', '600000']);
    const s = await gen(w, { max_tokens: 10_000 });
    await s.first;
    w.signal('SIGTERM');
    await w.waitForEvent('shutdown_started');
    const resume = await call('POST', `${w.systemUrl}/engine/resume`);
    assert.equal(resume.status, 409);
    assert.equal(resume.body.error.code, 'shutdown_in_progress');
    const drain = await call('POST', `${w.systemUrl}/engine/drain`);
    assert.equal(drain.status, 409);
    assert.equal(drain.body.error.code, 'shutdown_in_progress');
    const status = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(status.status, 200);
    assert.equal(status.body.state, 'stopping');
    assert.equal(status.body.shutting_down, true);
    assert.equal(status.body.admission_open, false);
    w.signal('SIGTERM');
    assert.equal(await w.exitCode(), 130);
    // Even a cancelled shutdown ends the running stream explicitly, never with a silent cut.
    const { last } = tokensOf(await s.done);
    assert.equal(last.error?.code, 'worker_shut_down');
    const cancelled = await w.waitForEvent('shutdown_stage', (l) => l.stage === 'grace');
    assert.equal(cancelled.outcome, 'cancelled');
  });

  it('hands off what still runs at the deadline, says so in the stream, and exits 0', async () => {
    const w = await worker(['--mocker-itl-ms', '50', '--shutdown-grace-ms', '0', '--drain-timeout-ms', '300']);
    const s = await gen(w, { max_tokens: 10_000, request_id: 'long-one' });
    await s.first;
    w.signal('SIGTERM');
    assert.equal(await w.exitCode(), 0, 'a handed-off stream is not lost: the caller continues it elsewhere');
    const handed = await w.waitForEvent('handed_off');
    assert.equal(handed.request_id, 'long-one');
    const { tokens, last } = tokensOf(await s.done);
    assert.ok(tokens > 0);
    assert.equal(last.handoff?.reason, 'drain_deadline', 'the stream ends with a hand-off line');
    assert.equal(last.handoff?.completion_tokens, tokens, 'naming exactly what it generated');
    const stages = Object.fromEntries(w.logs.filter((l) => l.event === 'shutdown_stage').map((l) => [l.stage, l.outcome]));
    assert.equal(stages.wait_inflight, 'timed_out');
    assert.equal(stages.handoff, 'completed');
    assert.equal(stages.cut_inflight, 'skipped');
  });

  it('records the router grace only when it unregistered: completed after SIGTERM while serving', async () => {
    const w = await worker(['--shutdown-grace-ms', '50']);
    w.signal('SIGTERM');
    assert.equal(await w.exitCode(), 0);
    const stages = Object.fromEntries(w.logs.filter((l) => l.event === 'shutdown_stage').map((l) => [l.stage, l.outcome]));
    assert.deepEqual(stages, { unregister: 'completed', grace: 'completed', wait_inflight: 'completed', handoff: 'skipped', cut_inflight: 'skipped', cleanup: 'completed' });
    const done = await w.waitForEvent('state_changed', (l) => l.to === 'stopped');
    assert.equal(done.from, 'stopping');
  });

  it('skips the grace after an Admin drain', async () => {
    const w = await worker(['--shutdown-grace-ms', '600000']);
    await call('POST', `${w.systemUrl}/engine/drain`);
    w.signal('SIGTERM');
    assert.equal(await w.exitCode(), 0);
    const stages = Object.fromEntries(w.logs.filter((l) => l.event === 'shutdown_stage').map((l) => [l.stage, l.outcome]));
    assert.equal(stages.unregister, 'skipped');
    assert.equal(stages.grace, 'skipped');
  });

  it('a stalled admin request does not hold an idle worker past its shutdown bound (no watchdog exit)', async () => {
    const w = await worker(['--shutdown-grace-ms', '0', '--drain-timeout-ms', '300']);
    const { port, hostname } = new URL(w.systemUrl);
    const stalled = connect(Number(port), hostname);
    await once(stalled, 'connect');
    stalled.on('error', () => undefined);
    // Headers promise a body that never comes: the server holds the request open.
    stalled.write('POST /engine/drain HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{');
    await w.waitForLog(() => true); // the worker is up and logging
    w.signal('SIGTERM');
    assert.equal(await w.exitCode(), 0, 'an idle worker exits 0, not 70 (the hang code)');
    const cleanup = await w.waitForEvent('shutdown_stage', (l) => l.stage === 'cleanup');
    assert.ok(cleanup.outcome === 'completed' || cleanup.outcome === 'timed_out');
    stalled.destroy();
  });
});

describe('worker process: request ownership', () => {
  /** A client that sends a stream request and never reads it, so the worker blocks on backpressure. */
  async function stalledReader(w: WorkerHandle, body: Record<string, unknown>): Promise<Socket> {
    const { port, hostname } = new URL(w.requestUrl);
    const sock = connect(Number(port), hostname);
    await once(sock, 'connect');
    sock.on('error', () => undefined);
    const payload = JSON.stringify(body);
    sock.write(`POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(payload)}\r\n\r\n${payload}`);
    sock.pause();
    return sock;
  }

  it('a slow reader that then disconnects frees its engine sequence, and the worker drains', async () => {
    const w = await worker(['--mocker-itl-ms', '0', '--mocker-ttft-ms', '0']);
    const sock = await stalledReader(w, { model: 'm1', prompt: 'x', max_tokens: 1_000_000 });
    // Wait until generation stops advancing: the worker is blocked writing to the full socket.
    let previous = -1;
    await bounded(
      (async () => {
        for (;;) {
          const st = await call('GET', `${w.systemUrl}/engine/status`);
          const n = st.body.engine.generated_tokens as number;
          if (n > 0 && n === previous) return;
          previous = n; // each read is a round trip: tokens flowing would have advanced meanwhile
        }
      })(),
      'generation blocked on backpressure',
      // Loopback's socket buffers grow to megabytes before the writes block: on a loaded machine
      // (four test files at once) the mocker takes longer than the usual bound to fill them.
      START_BOUND_MS,
    );
    const blocked = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(blocked.body.engine.running_sequences, 1);
    assert.equal(blocked.body.inflight_requests, 1);
    sock.destroy();
    const drain = await call('POST', `${w.systemUrl}/engine/drain`);
    if (drain.body.state !== 'drained') await w.waitForEvent('state_changed', (l) => l.to === 'drained');
    const status = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(status.body.inflight_requests, 0);
    assert.equal(status.body.engine.running_sequences, 0, 'the generator was closed');
    const metrics = await fetch(`${w.systemUrl}/metrics`).then((r) => r.text());
    assert.match(metrics, /ebb_worker_requests_total\{outcome="dropped"\} 1/);
  });

  it('every way a request ends releases it exactly once: in-flight back to 0, admitted == ended', async () => {
    const w = await worker(['--mocker-itl-ms', '5']);
    const done = await gen(w, { max_tokens: 3 });
    await done.done;
    const whole = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'x', max_tokens: 3, stream: false });
    assert.equal(whole.status, 200);
    const dropped = await gen(w, { max_tokens: 100_000 });
    await dropped.first;
    dropped.abort();
    const stopped = await gen(w, { max_tokens: 3, stop: 'the' }); // may end early on a stop string
    await stopped.done;
    const drain = await call('POST', `${w.systemUrl}/engine/drain`);
    if (drain.body.state !== 'drained') await w.waitForEvent('state_changed', (l) => l.to === 'drained');
    const refused = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'x' });
    assert.equal(refused.status, 503);
    const status = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(status.body.inflight_requests, 0);
    const text = await fetch(`${w.systemUrl}/metrics`).then((r) => r.text());
    const sample = (re: RegExp) => Number(re.exec(text)?.[1] ?? 0);
    const admitted = sample(/^ebb_worker_admitted_total (\d+)/m);
    const ended = ['completed', 'errored', 'dropped'].reduce((n, o) => n + sample(new RegExp(`^ebb_worker_requests_total\\{outcome="${o}"\\} (\\d+)`, 'm')), 0);
    assert.equal(admitted, 4, 'refusals are not admitted');
    assert.equal(ended, admitted, 'each admitted request ended exactly once');
    assert.equal(sample(/^ebb_worker_requests_total\{outcome="dropped"\} (\d+)/m), 1);
  });

  it('rejects a request_id that is not a legal header value before any work', async () => {
    const w = await sharedWorker();
    const before = (await call('GET', `${w.systemUrl}/engine/status`)).body.engine.generated_tokens as number;
    const bad = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'x', request_id: 'id with spaces\u00e9' });
    assert.equal(bad.status, 400);
    assert.deepEqual([bad.body.error.code, bad.body.error.param], ['invalid_value', 'request_id']);
    const st = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(st.body.engine.generated_tokens, before);
  });

  it('refuses unknown fields in admin bodies instead of ignoring them', async () => {
    const w = await sharedWorker();
    const drain = await call('POST', `${w.systemUrl}/engine/drain`, { reason: 'x', deadline: 5 });
    assert.equal(drain.status, 400);
    assert.deepEqual([drain.body.error.code, drain.body.error.param], ['unknown_parameter', 'deadline']);
    assert.equal((await call('GET', `${w.systemUrl}/engine/status`)).body.state, 'serving');
  });

  it('needs the request-plane token when one is set', async () => {
    const w = await worker([], { EBB_REQUEST_TOKEN: 'plane-secret' });
    const none = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'x', stream: false });
    assert.equal(none.status, 401);
    const wrong = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'x', stream: false }, { authorization: 'Bearer nope' });
    assert.equal(wrong.status, 403);
    const ok = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'x', stream: false, max_tokens: 2 }, { authorization: 'Bearer plane-secret' });
    assert.equal(ok.status, 200);
    assert.equal(ok.body.usage.completion_tokens, 2);
  });

  it('refuses to bind the request plane off loopback without a token', async () => {
    const p = spawnEbb(['worker', '--host', '0.0.0.0', '--port', '0', '--system-port', '0', '--discovery', tempDiscoveryUrl()], 'worker');
    assert.notEqual(await p.exitCode(), 0);
    assert.match(p.stderr.join('\n'), /refusing to serve the request plane on non-loopback address 0\.0\.0\.0/);
    assert.ok(!p.logs.some((l) => l.event === 'worker_ready'));
  });
});
