/**
 * The frontend's SIGTERM in the order a load balancer needs: readiness fails at once while the
 * listener keeps accepting and serving for --shutdown-grace-ms; then it stops accepting; at
 * --shutdown-timeout-ms every request still open gets an answer (an SSE error event in a stream, a
 * 503 JSON error before one), never a bare connection close.
 */
import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { call, rawConnect } from './helpers/http.js';
import { bounded, frontendSeesWorkers, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess } from './helpers/processes.js';
import { streamCompletion, type StreamOutcome } from './helpers/sse.js';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

/** A stream that runs until something ends it, handed back once its first token arrived. */
async function longStream(url: string): Promise<{ outcome: Promise<StreamOutcome> }> {
  let first!: () => void;
  const began = new Promise<void>((r) => (first = r));
  const outcome = streamCompletion(url, { model: 'm1', max_tokens: 100_000 }, () => first());
  await bounded(Promise.race([began, outcome.then((o) => Promise.reject(new Error(`the stream ended before its first token: ${o.status} ${o.error}`)))]), 'a first token');
  return { outcome };
}

describe('frontend: SIGTERM', () => {
  it('fails /health at once, serves through the grace, refuses after it, and ends what is open at the deadline with server_closing', async () => {
    const discovery = tempDiscoveryUrl();
    started.push(await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '50']));
    const frontend = await startFrontend(discovery, ['--shutdown-grace-ms', '3000', '--shutdown-timeout-ms', '1500']);
    started.push(frontend);
    assert.equal((await call('GET', `${frontend.url}/health`)).status, 200);
    const before = await longStream(frontend.url);

    frontend.signal('SIGTERM');
    await frontend.waitForEvent('shutdown_grace');
    const health = await call('GET', `${frontend.url}/health`);
    assert.equal(health.status, 503, 'readiness fails at once');
    assert.equal(health.body.status, 'shutting_down');
    // Still accepting and serving during the grace: a balancer that has not noticed yet loses nothing.
    const whole = call('POST', `${frontend.url}/v1/completions`, { model: 'm1', prompt: 'long', max_tokens: 100_000 });
    const during = await longStream(frontend.url);

    await frontend.waitForEvent('shutdown_accepting_stopped');
    await assert.rejects(rawConnect(frontend.url), /ECONNREFUSED/, 'no new connection after the grace');

    const [a, b, c] = await bounded(Promise.all([before.outcome, during.outcome, whole]), 'every open request answered');
    for (const s of [a, b]) {
      assert.ok(s.tokens > 0, 'the stream had started');
      assert.equal(s.done, false);
      assert.equal(s.errorCode, 'server_closing', `an error event, not a bare close: ${s.error}`);
    }
    assert.equal(c.status, 503, JSON.stringify(c.body));
    assert.equal(c.body.error.code, 'server_closing');
    assert.equal(c.body.error.retryable, true);
    assert.equal(c.headers.get('retry-after'), null, 'no guess: the process is going away');
    assert.equal((await frontend.waitForEvent('shutdown_deadline')).open_requests, 3);
    assert.equal(await frontend.exitCode(), 1, 'exit 1: requests had to be ended');
  });
});

describe('frontend: the shutdown deadline by default (issue 43)', () => {
  it('gives open streams 300 s after SIGTERM (an agent turn runs minutes), and a Ctrl-C (SIGINT) at most 10 s', async () => {
    const discovery = tempDiscoveryUrl();
    started.push(await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '50']));
    const idle = await startFrontend(discovery, ['--shutdown-grace-ms', '0']);
    started.push(idle);
    idle.signal('SIGTERM');
    assert.equal((await idle.waitForEvent('frontend_stopping')).timeout_ms, 300_000, 'SIGTERM: the default deadline');
    assert.equal(await idle.exitCode(), 0, 'nothing open: it exits at once, whatever the deadline');

    const frontend = await startFrontend(discovery);
    started.push(frontend);
    await frontendSeesWorkers(frontend, 1);
    const open = await longStream(frontend.url);
    frontend.signal('SIGINT');
    assert.equal((await frontend.waitForEvent('frontend_stopping')).timeout_ms, 10_000, 'Ctrl-C: capped');
    // Bounded well under the 300 s SIGTERM deadline (a loaded machine may be slow to end it): a Ctrl-C does not hang for it.
    const cut = await bounded(open.outcome, 'the stream ended at the Ctrl-C deadline', 90_000);
    assert.equal(cut.done, false);
    assert.equal(cut.errorCode, 'server_closing', `an error event, not a bare close: ${cut.error}`);
    assert.equal(await frontend.exitCode(), 1, 'exit 1: a stream had to be ended');
  });
});
