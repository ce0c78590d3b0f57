/**
 * A client that leaves before its first byte frees its work on the worker: the frontend's public
 * listener keeps half-open connections, so the leave is found out by the frontend's 1xx probe, not
 * by a write that never comes (src/frontend/api/client-gone.ts).
 */
import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { call, openLineStream, parseRawResponse, rawConnect } from './helpers/http.js';
import { bounded, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type WorkerHandle } from './helpers/processes.js';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

/** The worker has `n` admitted requests (a precondition: the requests under test reached it). */
async function admitted(w: WorkerHandle, n: number): Promise<void> {
  await bounded(
    (async () => {
      while ((await call('GET', `${w.systemUrl}/engine/status`)).body.inflight_requests !== n) await sleep(50);
    })(),
    `worker has ${n} requests`,
  );
}

describe('client gone before its first byte', () => {
  it('frees a queued stream and the lanes of an n request on the worker; a half-closing client is still answered', async () => {
    const discovery = tempDiscoveryUrl();
    // One batch slot: everything after the first request queues on the worker, with no byte for its client.
    const w = await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-batch-slots', '1', '--mocker-itl-ms', '20']);
    started.push(w);
    const fe = await startFrontend(discovery);
    started.push(fe);
    await fe.waitForLog((l) => (l.event === 'worker_added' && l.worker_id === w.workerId) || (l.event === 'discovery_reset' && (l.workers as string[]).includes(w.workerId)), 'frontend sees the worker');

    // A half-closing client (nc -N) on a free worker still gets its answer, the probe skipped.
    const body = JSON.stringify({ model: 'm1', prompt: 'x', max_tokens: 3 });
    const conn = await rawConnect(fe.url);
    conn.socket.write(`POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
    conn.socket.end();
    const answered = parseRawResponse(await bounded(conn.closed, 'the half-closed client is answered'));
    assert.equal(answered.status, 200, answered.headers);
    assert.equal(answered.body.usage.completion_tokens, 3);

    const busy = await openLineStream(`${fe.url}/v1/completions`, { model: 'm1', prompt: 'hold the slot', max_tokens: 100_000, stream: true }, '\n\n');
    await busy.first;
    const queued = new AbortController();
    const streamed = fetch(`${fe.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'm1', prompt: 'queued', max_tokens: 100_000, stream: true }), signal: queued.signal });
    streamed.catch(() => undefined);
    await admitted(w, 2);
    const lanes = new AbortController();
    const batch = fetch(`${fe.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'm1', prompt: 'many', max_tokens: 100_000, n: 4 }), signal: lanes.signal });
    batch.catch(() => undefined);
    await admitted(w, 6);

    queued.abort();
    lanes.abort();
    busy.abort(); // mid-stream: found at the next write, as before
    // Drained means every one of the six is gone; a leaked one would generate 100,000 tokens first.
    const drain = await call('POST', `${w.systemUrl}/engine/drain`);
    if (drain.body.state !== 'drained') await w.waitForEvent('state_changed', (l) => l.to === 'drained');
    const metrics = await fetch(`${w.systemUrl}/metrics`).then((r) => r.text());
    assert.match(metrics, /ebb_worker_requests_total\{outcome="dropped"\} 6/);
  });
});
