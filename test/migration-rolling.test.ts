/**
 * A rolling restart over two workers with fixed ids (a StatefulSet's pods): A drains with a short
 * deadline and hands its streams to B, where all but one wait queued; A restarts under the same id
 * and serves; B drains with a short deadline. The continuations still queued on B when its deadline
 * hands them off (before their first token there) go on to A, although each left A once.
 */
import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { call } from './helpers/http.js';
import { startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type WorkerHandle } from './helpers/processes.js';
import { streamCompletion } from './helpers/sse.js';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

async function worker(discovery: string, id: string, args: string[] = []): Promise<WorkerHandle> {
  const w = await startWorker(['--discovery', discovery, '--model', 'm1', '--worker-id', id, '--mocker-itl-ms', '10', ...args]);
  started.push(w);
  return w;
}

describe('migration: rolling restart over two workers with fixed ids', () => {
  it('continuations queued on B at its drain deadline go to A, restarted and serving: every stream completes', async () => {
    const discovery = tempDiscoveryUrl();
    let a = await worker(discovery, 'w-roll-a');
    const fe = await startFrontend(discovery);
    started.push(fe);
    await fe.waitForLog((l) => (l.event === 'worker_added' && l.worker_id === a.workerId) || (l.event === 'discovery_reset' && (l.workers as string[]).includes(a.workerId)), 'frontend sees A');

    const STREAMS = 4;
    const MAX = 1500;
    let firsts = 0;
    let allStreaming!: () => void;
    const streaming = new Promise<void>((resolve) => (allStreaming = resolve));
    const streams = Array.from({ length: STREAMS }, (_, i) =>
      streamCompletion(fe.url, { model: 'm1', max_tokens: MAX, seed: i }, () => {
        if (++firsts === STREAMS) allStreaming();
      }),
    );
    await streaming;

    // B runs one sequence at a time: of A's streams handed to it, all but one wait in its queue.
    let mark = fe.mark();
    const b = await worker(discovery, 'w-roll-b', ['--mocker-batch-slots', '1']);
    await fe.waitForEvent('worker_added', (l) => l.worker_id === b.workerId, { after: mark });
    mark = fe.mark();
    assert.equal((await call('POST', `${a.systemUrl}/engine/drain`, { deadline_ms: 300 })).status, 202);
    await fe.waitForEvent('stream_migrated', (l) => l.from_worker === a.workerId && l.to_worker === b.workerId, { after: mark });
    await a.waitForEvent('state_changed', (l) => l.to === 'drained');

    // A restarts under the same id.
    await a.stop();
    mark = fe.mark();
    a = await worker(discovery, 'w-roll-a');
    await fe.waitForEvent('worker_added', (l) => l.worker_id === a.workerId, { after: mark });
    const onB = (await call('GET', `${b.systemUrl}/engine/status`)).body;
    assert.ok(onB.engine.queued_sequences > 0, `continuations queued on B before its drain: ${JSON.stringify(onB)}`);

    assert.equal((await call('POST', `${b.systemUrl}/engine/drain`, { deadline_ms: 300 })).status, 202);
    const outcomes = await Promise.all(streams);
    for (const [i, r] of outcomes.entries()) {
      assert.equal(r.error, undefined, `stream ${i}: ${r.error}`);
      assert.equal(r.tokens, MAX, `stream ${i}`);
      assert.equal(r.doneEvents, 1, `stream ${i}`);
    }
  });
});
