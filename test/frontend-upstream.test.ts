import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import type { ServerResponse } from 'node:http';
import { createFrontendMetrics } from '../src/frontend/metrics.js';
import { Upstream } from '../src/frontend/relay/upstream.js';
import { WorkerPool } from '../src/frontend/routing/worker-pool.js';
import { fakeWorker, type FakeWorker } from './helpers/http.js';

const fakes: FakeWorker[] = [];
after(async () => {
  await Promise.all(fakes.map((f) => f.close()));
});

/**
 * A worker whose /generate sends a token and, when `final`, its terminal line, then holds the
 * response open until the test lets it end: the frontend's release happens in between.
 */
async function heldWorker(final: boolean) {
  let letEnd!: () => void;
  const mayEnd = new Promise<void>((resolve) => (letEnd = resolve));
  let responded!: (res: ServerResponse) => void;
  const response = new Promise<ServerResponse>((resolve) => (responded = resolve));
  const fake = await fakeWorker((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/x-ndjson' });
    const usage = { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 };
    res.write(JSON.stringify({ text: 'a' }) + '\n' + (final ? JSON.stringify({ done: true, finish_reason: 'stop', usage }) + '\n' : ''));
    responded(res);
    void mayEnd.then(() => res.end());
  });
  fakes.push(fake);
  return { fake, letEnd, response };
}

function upstreamTo(url: string) {
  const pool = new WorkerPool();
  pool.apply({ type: 'reset', records: [{ worker_id: 'w-1', model: 'm', mode: 'aggregated', request_url: url, system_url: url }] });
  const upstream = new Upstream(pool, createFrontendMetrics(pool));
  after(() => upstream.close());
  return { pool, upstream };
}

describe('upstream: releasing a stream', () => {
  it('lets a body that got its final line end normally (no abort)', async () => {
    const { fake, letEnd, response } = await heldWorker(true);
    const { pool, upstream } = upstreamTo(fake.url);
    const up = await upstream.open({ model: 'm' }, 'aggregated', new AbortController().signal);
    assert.ok(up.first.some((l) => 'done' in l), 'the final line came with the first batch');
    up.release();
    assert.equal(pool.get('w-1')!.inflight, 0);
    const res = await response;
    const resClosed = once(res, 'close');
    letEnd();
    assert.equal(await up.closed, true, 'the body ended normally: not destroyed on release');
    await resClosed;
    assert.equal(res.writableFinished, true, 'the worker finished its response: the frontend did not abort it');
  });

  it('destroys a body released before its final line, freeing the worker', async () => {
    const { fake, response } = await heldWorker(false);
    const { upstream } = upstreamTo(fake.url);
    const up = await upstream.open({ model: 'm' }, 'aggregated', new AbortController().signal);
    const res = await response;
    const resClosed = once(res, 'close');
    up.release();
    assert.equal(await up.closed, false, 'destroyed');
    await resClosed;
    assert.equal(res.writableFinished, false, 'cut before the worker finished');
  });
});
