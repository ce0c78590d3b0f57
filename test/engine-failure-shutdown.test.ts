/**
 * An engine that dies runs the worker's one shutdown (the same stages, metrics and audit as
 * SIGTERM's, without grace or wait), through the lifecycle's `failed` state.
 */
import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { call, openLineStream } from './helpers/http.js';
import { spawnEbb, tempDiscoveryUrl, type EbbProcess } from './helpers/processes.js';

const started: EbbProcess[] = [];
after(async () => Promise.all(started.map((p) => p.stop())));

describe('worker: its engine dies', () => {
  it('moves to failed and runs the shutdown stages: unregister, cut what runs, cleanup; exit 1', async () => {
    const w = spawnEbb(['worker', '--port', '0', '--system-port', '0', '--discovery', tempDiscoveryUrl(), '--model', 'm1', '--mocker-itl-ms', '20', '--mocker-fail-on-prompt', 'die now'], 'worker');
    started.push(w);
    const ready = await w.waitForEvent('worker_ready');
    const long = await openLineStream(`${ready.request_url as string}/generate`, { model: 'm1', prompt: 'a long answer', max_tokens: 100_000 });
    await long.first;
    await call('POST', `${ready.request_url as string}/generate`, { model: 'm1', prompt: 'die now', stream: false });
    assert.equal(await w.exitCode(), 1);
    const moved = await w.waitForEvent('state_changed', (l) => l.to === 'failed');
    assert.equal(moved.from, 'serving');
    assert.equal(moved.trigger, 'engine_failed');
    const stages = w.logs.filter((l) => l.event === 'shutdown_stage').map((l) => `${String(l.stage)}:${String(l.outcome)}`);
    assert.deepEqual(stages, ['unregister:completed', 'grace:skipped', 'wait_inflight:skipped', 'handoff:skipped', 'cut_inflight:completed', 'cleanup:completed']);
    const audit = w.logs.filter((l) => l.event === 'audit' && l.what === 'shutdown').map((l) => [l.actor, l.result]);
    assert.deepEqual(audit, [
      ['engine', 'started'],
      ['engine', 'engine failed (cut)'],
    ]);
    assert.equal((await w.waitForEvent('shutdown_complete')).exit_code, 1);
    assert.ok((await long.done).length > 0);
    assert.ok(w.logs.some((l) => l.event === 'state_changed' && l.from === 'failed' && l.to === 'stopped'));
  });
});
