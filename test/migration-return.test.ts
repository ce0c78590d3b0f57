/**
 * A stream may move back to a worker it left: each migration starts a fresh set of tried workers
 * (from the one it leaves), so after A hands a stream off to B and A is resumed, B's hand-off can
 * go back to A. A rolling drain over a two-worker fleet relies on it.
 */
import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { call } from './helpers/http.js';
import { metricValue, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type WorkerHandle } from './helpers/processes.js';
import { streamCompletion } from './helpers/sse.js';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

describe('migration: back to a resumed worker', () => {
  it('A hands off to B, A resumes, B hands off back to A: the stream completes', async () => {
    const discovery = tempDiscoveryUrl();
    const ws: WorkerHandle[] = [];
    for (let i = 0; i < 2; i++) {
      const w = await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '10']);
      started.push(w);
      ws.push(w);
    }
    const fe = await startFrontend(discovery);
    started.push(fe);
    for (const w of ws) {
      await fe.waitForLog((l) => (l.event === 'worker_added' && l.worker_id === w.workerId) || (l.event === 'discovery_reset' && (l.workers as string[]).includes(w.workerId)), `frontend sees ${w.workerId}`);
    }

    const MAX = 1500;
    let streaming!: () => void;
    const progressed = new Promise<void>((resolve) => (streaming = resolve));
    const stream = streamCompletion(fe.url, { model: 'm1', max_tokens: MAX, seed: 7 }, undefined, (n) => {
      if (n === 5) streaming();
    });
    await progressed;
    const serving = await Promise.all(ws.map(async (w) => (await call('GET', `${w.systemUrl}/engine/status`)).body.inflight_requests as number));
    const a = ws[serving.indexOf(1)]!;
    const b = ws.find((w) => w !== a)!;

    // A's drain deadline hands the stream to B.
    let mark = fe.mark();
    assert.equal((await call('POST', `${a.systemUrl}/engine/drain`, { deadline_ms: 300 })).status, 202);
    await fe.waitForEvent('stream_migrated', (l) => l.from_worker === a.workerId && l.to_worker === b.workerId, { after: mark });
    await a.waitForEvent('state_changed', (l) => l.to === 'drained');

    // A serves again, and the frontend routes to it.
    mark = fe.mark();
    assert.equal((await call('POST', `${a.systemUrl}/engine/resume`)).status, 200);
    await fe.waitForEvent('worker_added', (l) => l.worker_id === a.workerId, { after: mark });

    // B's drain deadline: the only serving worker is A, which this stream left once.
    mark = fe.mark();
    assert.equal((await call('POST', `${b.systemUrl}/engine/drain`, { deadline_ms: 300 })).status, 202);
    await fe.waitForEvent('stream_migrated', (l) => l.from_worker === b.workerId && l.to_worker === a.workerId, { after: mark });

    const r = await stream;
    assert.equal(r.error, undefined);
    assert.equal(r.tokens, MAX);
    assert.equal(r.doneEvents, 1);
    // Every worker the lane held, through two moves, was released once: none counts it in flight.
    for (const w of ws) assert.equal(await metricValue(fe.url, 'ebb_frontend_worker_inflight_requests', `worker_id="${w.workerId}"`), 0);
  });
});
