import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnEbb, type EbbProcess } from './helpers/processes.js';
import { streamCompletion } from './helpers/sse.js';

/**
 * Ctrl-C twice on `ebb up` (issue 26, item 5): the second stops everything at once, yet no open
 * stream is cut silently: each ends with an SSE error event saying why, and `ebb up` exits 130.
 * `ebb up`'s children have their own process groups, so a terminal's Ctrl-C reaches `ebb up` alone,
 * as the SIGINTs sent here do.
 */
describe('ebb up: a second Ctrl-C', () => {
  let up: EbbProcess | undefined;
  after(async () => {
    await up?.stop();
  });

  it('ends every open stream with an error event, then exits 130', async () => {
    // 50 ms a token, 2,000 tokens: the streams outlast both signals by far.
    up = spawnEbb(['up', '--port', '0', '--workers', '1', '--model', 'm1', '--mocker-itl-ms', '50'], 'ebb up', { EBB_ADMIN_TOKEN: undefined });
    const ready = await up.waitForEvent('frontend_ready');
    await up.waitForEvent('worker_ready');
    let started = 0;
    let allStarted!: () => void;
    const streaming = new Promise<void>((resolve) => (allStarted = resolve));
    const streams = [0, 1].map((seed) => streamCompletion(ready.url as string, { model: 'm1', max_tokens: 2000, seed }, () => ++started === 2 && allStarted()));
    await streaming;

    up.signal('SIGINT');
    await up.waitForStderr(/ebb up: SIGINT: draining the workers/);
    up.signal('SIGINT');
    const outcomes = await Promise.all(streams);
    for (const o of outcomes) {
      assert.equal(o.status, 200);
      assert.ok(o.tokens > 0 && o.tokens < 2000, `the stream was stopped early (${o.tokens} tokens)`);
      assert.equal(o.done, false);
      assert.ok(o.errorCode !== undefined, `the stream ended with an error event, not a bare close (${o.error ?? 'no error'})`);
    }
    assert.deepEqual(outcomes.map((o) => o.errorCode), ['server_closing', 'server_closing']);
    assert.equal(await up.exitCode(), 130);
    assert.match(up.stderr.join('\n'), /ebb up: second signal: stopping now/);
  });
});
