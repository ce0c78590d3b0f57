import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { request } from 'undici';
import { setTimeout as delay } from 'node:timers/promises';
import { call } from './helpers/http.js';
import { etcdFixture } from './helpers/etcd-fixture.js';
import { etcdSkipReason } from './helpers/etcd.js';
import { StallProxy } from './helpers/stall-proxy.js';
import { bounded, frontendSeesWorkers, runEbb, spawnWorker, startFrontend, startWorker, tempDiscoveryUrl, workerReady, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { FileRouteMarks } from '../src/discovery/file-route-marks.js';
import { streamCompletion, type StreamOutcome } from './helpers/sse.js';

/** GET /ready every 100 ms, as a kubelet's readiness probe would (periodSeconds), until it passes; resolves with when. */
async function readinessPasses(w: WorkerHandle, boundMs = 60_000): Promise<number> {
  return bounded(
    (async () => {
      for (;;) {
        const r = await call('GET', `${w.systemUrl}/ready`);
        if (r.status === 200) return Date.now();
        await delay(100);
      }
    })(),
    `${w.workerId}: /ready to pass`,
    boundMs,
  );
}

interface Outcome extends StreamOutcome {
  ttftMs: number;
  via: string;
}

/** `clients` closed loops of short streamed completions, spread over the frontends, until stop(). */
function steadyLoad(frontends: FrontendHandle[], clients: number) {
  const outcomes: Outcome[] = [];
  let stop = false;
  const loops = Array.from({ length: clients }, async (_, i) => {
    const fe = frontends[i % frontends.length]!;
    while (!stop) {
      const t0 = performance.now();
      let ttftMs = -1;
      const o = await streamCompletion(fe.url, { model: 'm1', max_tokens: 20, seed: i }, () => (ttftMs = performance.now() - t0)).catch(
        (err: Error): StreamOutcome => ({ status: 0, tokens: 0, text: '', done: false, error: `client: ${err.message}`, workerId: null, firstTokenSeen: false, doneEvents: 0, chunkIds: [] }),
      );
      outcomes.push({ ...o, ttftMs, via: fe.url });
    }
  });
  return {
    outcomes,
    async stop(): Promise<Outcome[]> {
      stop = true;
      await Promise.all(loops);
      return outcomes;
    },
  };
}

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

const failed = (o: Outcome) => o.status !== 200 || !o.done || o.tokens !== 20 || o.error !== undefined;

describe('rollouts that never open a gap (issue 45 item 2)', { skip: etcdSkipReason() }, () => {
  const fx = etcdFixture();

  it('a rolling replacement of every worker under 80 % load, each old one SIGTERMed once its replacement is ready (/ready), one frontend 10 s behind on discovery: 0 errors, no request waits past 2 s', async () => {
    const { hostname, port } = new URL(fx.etcd.endpoint);
    const link = new StallProxy(hostname, Number(port));
    await link.start();
    try {
      // 3 workers of 5 slots; 12 clients keep 80 % of the 15 slots busy, half through each frontend.
      const args = ['--model', 'm1', '--mocker-batch-slots', '5', '--mocker-itl-ms', '20'];
      const old = await Promise.all([0, 1, 2].map(() => fx.worker(args)));
      const near = await fx.frontend();
      // The far frontend reaches etcd over a link the test can partition.
      const far = await startFrontend(`etcd://${link.address}`);
      fx.started.push(far);
      await Promise.all([frontendSeesWorkers(near, 3), frontendSeesWorkers(far, 3)]);
      // Both frontends mark the workers they route to: each old worker says so.
      for (const w of old) {
        await bounded(
          (async () => {
            for (;;) {
              const r = (await call('GET', `${w.systemUrl}/ready`)).body;
              if (r.status === 'ready' && r.routed_by === 2 && r.frontends === 2) return;
              await delay(100);
            }
          })(),
          `${w.workerId}: routed by both frontends`,
        );
      }

      const load = steadyLoad([near, far], 12);
      await bounded(
        (async () => {
          while (load.outcomes.length < 24) await delay(50);
        })(),
        'the load to run',
      );
      // The far frontend hears nothing from etcd for 10 s from now (less than its mark's lease): its
      // view keeps the old workers, and it cannot see (or mark) their replacements until it heals.
      // Stalled before they start: however slow the machine, none can reach its view sooner.
      link.stall();
      const healed = delay(10_000).then(() => {
        link.release();
        return Date.now();
      });
      // A rolling update with a surge of 3: every replacement at once (each loads its model for 3 s),
      // and each old worker SIGTERMed the moment one replacement's readiness passes.
      const spawned = [0, 1, 2].map(() => spawnWorker(['--discovery', fx.etcd.url, ...args, '--mocker-load-ms', '3000']));
      fx.started.push(...spawned);
      const fresh = await Promise.all(spawned.map((p) => workerReady(p)));
      const readyAt = await Promise.all(
        fresh.map(async (w, i) => {
          const at = await readinessPasses(w);
          old[i]!.signal('SIGTERM');
          return at;
        }),
      );
      const healedAt = await healed;
      for (const [i, w] of old.entries()) assert.equal(await w.exitCode(60_000), 0, `old worker ${i} drained and exited`);
      // Traffic on the replacements alone, through both frontends.
      const settled = load.outcomes.length;
      await bounded(
        (async () => {
          while (load.outcomes.length < settled + 24) await delay(50);
        })(),
        'the load to go on after the rollout',
      );
      const outcomes = await load.stop();

      const errors = outcomes.filter(failed);
      assert.deepEqual(
        errors.map((o) => `via ${o.via}: HTTP ${o.status} ${o.error ?? ''}`),
        [],
        `0 client-visible errors of ${outcomes.length} requests`,
      );
      for (const fe of [near, far]) {
        const waits = fe.logs.filter((l) => l.event === 'request_dequeued').map((l) => l.waited_ms as number);
        assert.ok(waits.every((ms) => ms <= 2000), `no request waited past 2 s in ${fe.url}'s queue: ${waits.join(', ')} ms`);
        const queued = fe.logs.filter((l) => l.event === 'request_queued').length;
        assert.equal(waits.length, queued, 'every queued request left the queue');
      }
      for (const at of readyAt) assert.ok(at >= healedAt - 1000, 'a replacement was ready only once the far frontend could route to it');
      const served = new Set(outcomes.slice(settled).map((o) => o.workerId));
      for (const w of fresh) assert.ok(served.has(w.workerId), `${w.workerId} serves after the rollout`);
      const ttfts = outcomes.map((o) => o.ttftMs).sort((a, b) => a - b);
      process.stderr.write(`rollout under load: ${outcomes.length} requests, ttft p50 ${Math.round(ttfts[Math.floor(ttfts.length / 2)]!)} ms, max ${Math.round(ttfts.at(-1)!)} ms\n`);
    } finally {
      link.release();
      await link.close();
    }
  });
});

describe('GET /ready', () => {
  it('waits for every frontend that marks workers (file discovery), names the one it waits for, and answers a probe under any Host', async () => {
    const discovery = tempDiscoveryUrl();
    const w = await startWorker(['--discovery', discovery, '--model', 'm1']);
    started.push(w);
    const ready = async () => {
      const res = await request(`${w.systemUrl}/ready`, { headers: { host: 'worker-0.ebb.svc:9090' } }); // as a kubelet addresses a pod
      return { status: res.statusCode, body: (await res.body.json()) as Record<string, any> };
    };
    // No frontend marks anything: none to wait for.
    await w.waitForLog((l) => l.event === 'routing_changed' && l.to === 'routed' && l.frontends === 0, 'the first read of the marks');
    assert.equal((await ready()).status, 200);
    const fe = await startFrontend(discovery);
    started.push(fe);
    await w.waitForLog((l) => l.event === 'routing_changed' && l.to === 'routed' && l.frontends === 1, 'the frontend to mark the worker');
    assert.deepEqual((await ready()).body.routed_by, 1);
    // A second frontend whose view does not have the worker (yet): the worker is not ready until it does.
    const lagging = new FileRouteMarks(new URL(discovery).pathname, 3000);
    await lagging.publish({ frontend_id: 'f-lagging', workers: [] });
    try {
      await w.waitForLog((l) => l.event === 'routing_changed' && l.to === 'waiting' && l.frontends === 2, 'the worker to see the lagging frontend');
      const waiting = await ready();
      assert.equal(waiting.status, 503);
      assert.equal(waiting.body.routed, false);
      assert.match(waiting.body.waiting_for.join('; '), /1 of 2 frontend\(s\) \(waiting for f-lagging\)/);
      assert.equal((await call('GET', `${w.systemUrl}/engine/status`)).body.routed, false);
      assert.equal((await call('GET', `${w.systemUrl}/health`)).status, 200, '/health: it serves all the same');
      await lagging.publish({ frontend_id: 'f-lagging', workers: [w.workerId] });
      await w.waitForLog((l) => l.event === 'routing_changed' && l.to === 'routed' && l.frontends === 2, 'the lagging frontend to mark the worker');
      assert.equal((await ready()).status, 200);
      // A drained worker is not ready, whatever the marks say.
      await call('POST', `${w.systemUrl}/engine/drain`, {});
      assert.equal((await ready()).status, 503);
    } finally {
      await lagging.close();
    }
  });

  it('ebb rollout --model waits for the serving count among workers every frontend routes to: a frontend that does not route to the resumed worker stops it at --timeout', async () => {
    const discovery = tempDiscoveryUrl();
    const ws = await Promise.all(['r-1', 'r-2'].map((id) => startWorker(['--discovery', discovery, '--model', 'm1', '--worker-id', id])));
    started.push(...ws);
    const fe = await startFrontend(discovery);
    started.push(fe);
    for (const w of ws) await w.waitForLog((l) => l.event === 'routing_changed' && l.to === 'routed' && l.frontends === 1, `the frontend to mark ${w.workerId}`);
    // A frontend whose view has r-2 only (it never saw r-1): r-1 serves, but not every frontend routes to it.
    const lagging = new FileRouteMarks(new URL(discovery).pathname, 3000);
    await lagging.publish({ frontend_id: 'f-lagging', workers: ['r-2'] });
    try {
      await ws[0]!.waitForLog((l) => l.event === 'routing_changed' && l.to === 'waiting', 'r-1 to see the lagging frontend');
      const res = await runEbb(['rollout', '--model', 'm1', '--discovery', discovery, '--timeout', '3s'], { EBB_ADMIN_TOKEN: undefined }, 60_000);
      assert.equal(res.code, 2, res.stderr);
      assert.match(res.stderr, /r-1: resumed/);
      assert.match(res.stderr, /model m1 has 1 serving worker\(s\) that every frontend routes to, not 2/);
      assert.equal((await call('GET', `${ws[1]!.systemUrl}/engine/status`)).body.state, 'serving', 'r-2 was never taken out');
    } finally {
      await lagging.close();
    }
  });
});
