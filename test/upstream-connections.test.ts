import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { createFrontendMetrics } from '../src/frontend/metrics.js';
import { Upstream } from '../src/frontend/relay/upstream.js';
import { WAITING_METRIC, waitingRequests } from '../src/frontend/relay/upstream-agent.js';
import { WorkerPool } from '../src/frontend/routing/worker-pool.js';
import { fakeWorker, openLineStream, type OpenStream } from './helpers/http.js';
import { bounded, metricValue, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess } from './helpers/processes.js';

const procs: EbbProcess[] = [];
after(async () => {
  await Promise.all(procs.map((p) => p.stop()));
});

/** The cap the frontend used to have, silently, per worker. */
const OLD_CAP = 512;

describe('upstream connections', () => {
  it('every stream reaches a worker that admits more than the old per-worker cap', async () => {
    const N = OLD_CAP + 8;
    const discovery = tempDiscoveryUrl();
    // Each sequence gets its first token at once, then waits: all N are open on the worker together.
    const worker = await startWorker(['--model', 'm', '--discovery', discovery, '--mocker-ttft-ms', '0', '--mocker-itl-ms', '60000', '--mocker-batch-slots', String(N + 100)]);
    procs.push(worker);
    const frontend = await startFrontend(discovery);
    procs.push(frontend);
    await frontend.waitForEvent('discovery_reset');
    const streams: OpenStream[] = await Promise.all(
      Array.from({ length: N }, () => openLineStream(`${frontend.url}/v1/completions`, { model: 'm', prompt: 'x', max_tokens: 4, stream: true }, '\n\n')),
    );
    try {
      // A request waiting for a connection inside the frontend would never get its first token here.
      const firsts = await bounded(Promise.all(streams.map((s) => s.first)), `first token on all ${N} streams`, 60_000);
      // What each stream opened with, where it was not a token (an answer other than 200, an error event): the failure says which.
      const odd = streams.map((s, i) => ({ status: s.status, first: firsts[i]! })).filter((x) => x.status !== 200 || !x.first.startsWith('data: {"id"'));
      assert.deepEqual(odd.slice(0, 5), [], `every stream opens with a token (${odd.length} of ${N} did not)`);
      assert.equal(await metricValue(worker.systemUrl, 'ebb_worker_inflight_requests'), N, 'the worker runs every stream');
      assert.equal(await metricValue(frontend.url, WAITING_METRIC), 0, 'none waits in the frontend');
    } finally {
      for (const s of streams) s.abort();
    }
  });

  it('an explicit cap makes requests past it wait, and counts them', async () => {
    let arrived = 0;
    let onArrival: (() => void) | undefined;
    const fake = await fakeWorker((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.write(JSON.stringify({ text: 'a' }) + '\n');
      arrived++;
      onArrival?.();
    });
    after(() => fake.close());
    const pool = new WorkerPool();
    pool.apply({ type: 'reset', records: [{ worker_id: 'w-1', model: 'm', mode: 'aggregated', request_url: fake.url, system_url: fake.url }] });
    const metrics = createFrontendMetrics(pool);
    const upstream = new Upstream(pool, metrics, { connections: 2 });
    after(() => upstream.agent.destroy());
    const signal = new AbortController().signal;
    const first = await Promise.all([upstream.open({ model: 'm' }, 'aggregated', signal), upstream.open({ model: 'm' }, 'aggregated', signal)]);
    const third = upstream.open({ model: 'm' }, 'aggregated', signal);
    const thirdArrived = new Promise<void>((resolve) => (onArrival = resolve));
    await new Promise<void>((resolve) => setImmediate(resolve)); // let the request reach the pool's queue
    assert.equal(arrived, 2);
    assert.equal(waitingRequests(upstream.agent), 1);
    assert.match(await metrics.registry.metrics(), new RegExp(`^${WAITING_METRIC} 1$`, 'm'));
    first[0]!.release(); // frees a connection: the waiting request goes out on it
    await thirdArrived;
    (await third).release();
    first[1]!.release();
    assert.equal(waitingRequests(upstream.agent), 0);
  });
});
