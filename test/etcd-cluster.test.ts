/**
 * Workers and a frontend as real processes on a real etcd: drain ordering against the keys, lease
 * expiry after a crash, an etcd outage longer than the leases, and drain under load. Every wait is
 * bounded and event-driven (log lines, etcd reads); nothing sleeps and nothing asserts on timing.
 */
import { MockerEngine } from '../src/engine/mocker.js';
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { etcdKey } from '../src/discovery/etcd.js';
import { etcdSkipReason } from './helpers/etcd.js';
import { etcdFixture } from './helpers/etcd-fixture.js';
import { call } from './helpers/http.js';
import { drainOneUnderLoad } from './helpers/load.js';
import type { EbbProcess, LogLine, WorkerHandle } from './helpers/processes.js';
import { streamCompletion } from './helpers/sse.js';

/** Short leases keep the crash and outage tests quick (etcd's minimum TTL is about 2 s anyway). */
const LEASE_TTL_MS = '2000';

/** The first line at index >= `since` with this event that matches `pred`. */
function eventSince(p: EbbProcess, since: number, event: string, pred: (l: LogLine) => boolean = () => true): Promise<LogLine> {
  return p.waitForLog((l) => l.event === event && pred(l) && p.logs.lastIndexOf(l) >= since, `event ${event} after line ${since}`);
}

/** The routing view a frontend's log lines describe (reset / added / removed), from line `since` on. */
function viewFromLogs(f: EbbProcess, since = 0): Set<string> {
  const view = new Set<string>();
  for (const l of f.logs.slice(since)) {
    if (l.event === 'discovery_reset') {
      view.clear();
      for (const id of l.workers as string[]) view.add(id);
    } else if (l.event === 'worker_added') view.add(l.worker_id as string);
    else if (l.event === 'worker_removed') view.delete(l.worker_id as string);
  }
  return view;
}

/** Resolves once the frontend's logged view contains every one of `ids`. */
function frontendSees(f: EbbProcess, ids: string[], what: string): Promise<LogLine> {
  return f.waitForLog(() => {
    const view = viewFromLogs(f);
    return ids.every((id) => view.has(id));
  }, what);
}

describe('etcd cluster: drain and crash', { skip: etcdSkipReason() }, () => {
  const fx = etcdFixture();

  it('drain removes the key only after admission closed; late requests get 503; resume puts the key back', async () => {
    const w = await fx.worker(['--model', 'drain-order']);
    const key = etcdKey({ model: 'drain-order', worker_id: w.workerId });
    const registered = await fx.keyedIds('drain-order');
    assert.deepEqual(Object.keys(registered), [key]);
    assert.deepEqual(JSON.parse(registered[key]!), {
      worker_id: w.workerId,
      model: 'drain-order',
      mode: 'aggregated',
      request_url: w.requestUrl,
      system_url: w.systemUrl,
      engine: 'mocker',
      // The mocker's own, as it publishes them (tools with its Hermes syntax).
      capabilities: new MockerEngine().capabilities,
      kv_cache: { block_size: 16, tokenizer: 'mocker-words', events: 'exact' },
    });
    const leaseBefore = (await fx.raw.get(key).exec()).kvs[0]?.lease;
    assert.ok(leaseBefore && leaseBefore !== '0', 'the key is bound to a lease');

    const drain = await call('POST', `${w.systemUrl}/engine/drain`);
    assert.equal(drain.status, 200);
    assert.equal(drain.body.state, 'drained');
    assert.equal(drain.body.discovery_registered, false);
    assert.deepEqual(await fx.keyedIds('drain-order'), {}, 'the key is gone once the drain call returned');

    await w.waitForEvent('discovery_unregistered'); // log lines travel a pipe: they may trail the HTTP answer
    const closed = w.indexOfEvent('admission_closed');
    const unregistered = w.indexOfEvent('discovery_unregistered');
    assert.ok(closed >= 0 && unregistered > closed, `admission_closed (${closed}) must precede discovery_unregistered (${unregistered})`);

    const refused = await call('POST', `${w.requestUrl}/generate`, { model: 'drain-order', prompt: 'hi' });
    assert.equal(refused.status, 503);
    assert.equal(refused.body.error.code, 'worker_draining');

    const resumed = await call('POST', `${w.systemUrl}/engine/resume`);
    assert.equal(resumed.status, 200);
    assert.equal(resumed.body.state, 'serving');
    assert.equal(resumed.body.discovery_registered, true);
    const back = await fx.keyedIds('drain-order');
    assert.deepEqual(Object.keys(back), [key], 'resume puts the key back before it returns');
    assert.equal(JSON.parse(back[key]!).worker_id, w.workerId);
    const served = await call('POST', `${w.requestUrl}/generate`, { model: 'drain-order', prompt: 'hi', stream: false });
    assert.equal(served.status, 200);
  });

  it('a SIGKILLed worker disappears from the frontend when its lease expires', async () => {
    const w = await fx.worker(['--model', 'crash', '--lease-ttl-ms', LEASE_TTL_MS]);
    const f = await fx.frontend();
    await frontendSees(f, [w.workerId], `frontend to list ${w.workerId}`);
    const since = f.logs.length;

    w.signal('SIGKILL');
    await w.exitCode();
    // Nobody revoked the lease: only its expiry can remove the key.
    await eventSince(f, since, 'worker_removed', (l) => l.worker_id === w.workerId);
    assert.deepEqual(await fx.keyedIds('crash'), {});
    assert.ok(!viewFromLogs(f).has(w.workerId));
  });
});

describe('etcd cluster: etcd outage longer than the leases', { skip: etcdSkipReason() }, () => {
  const fx = etcdFixture();
  const BARRIER = { worker_id: 'barrier', model: 'barrier', mode: 'aggregated', request_url: 'http://127.0.0.1:9/', system_url: 'http://127.0.0.1:9/' } as const;

  it('workers re-register, the frontend resynchronises, and requests are served again', async () => {
    const args = ['--model', 'm1', '--lease-ttl-ms', LEASE_TTL_MS];
    const workers = [await fx.worker(args), await fx.worker(args)];
    const ids = workers.map((w) => w.workerId);
    const f = await fx.frontend();
    await frontendSees(f, ids, 'frontend to list both workers');

    const frontendSince = f.logs.length;
    const workerSince = workers.map((w) => w.logs.length);
    await fx.etcd.kill();
    // A worker only re-registers after its client declared the lease lost (no keepalive for 2 x TTL);
    // a failed attempt proves that happened while etcd was still down.
    await Promise.all(workers.map((w, i) => eventSince(w, workerSince[i]!, 'discovery_register_failed')));
    await fx.etcd.restart();

    await Promise.all(workers.map((w, i) => eventSince(w, workerSince[i]!, 'discovery_reregistered')));
    // The frontend's watch broke with etcd: it must list again (a reset) and end up with both workers.
    await eventSince(f, frontendSince, 'discovery_reset');
    // A barrier: the watch delivers in revision order, so once the frontend shows a record put after
    // the re-registrations, it has applied everything before them (e.g. the old leases expiring).
    await fx.raw.put(etcdKey(BARRIER)).value(JSON.stringify(BARRIER));
    await frontendSees(f, [BARRIER.worker_id], 'frontend to see the barrier record');
    const view = viewFromLogs(f);
    assert.ok(ids.every((id) => view.has(id)), `the frontend lists both workers after the outage: ${JSON.stringify([...view])}`);
    const barrierSince = f.logs.length;
    await fx.raw.delete().key(etcdKey(BARRIER));
    await eventSince(f, barrierSince, 'worker_removed', (l) => l.worker_id === BARRIER.worker_id);
    const keys = Object.values(await fx.keyedIds('m1')).map((v) => JSON.parse(v).worker_id as string);
    assert.deepEqual(keys.sort(), [...ids].sort(), 'both workers are registered in etcd again');

    const servedBy = new Set<string>();
    for (let i = 0; i < 4; i++) {
      const res = await streamCompletion(f.url, { model: 'm1', max_tokens: 5, seed: i });
      assert.equal(res.status, 200, res.error);
      assert.equal(res.tokens, 5, res.error);
      assert.equal(res.done, true);
      if (res.workerId) servedBy.add(res.workerId);
    }
    assert.deepEqual([...servedBy].sort(), [...ids].sort(), 'both re-registered workers are routed to');
  });
});

describe('etcd cluster: zero dropped requests', { skip: etcdSkipReason() }, () => {
  const fx = etcdFixture();

  it('drains one of 3 workers mid-load: every request completes, none reach it after drain returns, resume brings it back', async () => {
    const workers: WorkerHandle[] = [];
    for (let i = 0; i < 3; i++) workers.push(await fx.worker(['--model', 'm1', '--mocker-itl-ms', '3', '--mocker-ttft-ms', '5']));
    const f = await fx.frontend();
    await frontendSees(f, workers.map((w) => w.workerId), 'frontend to list the 3 workers');
    await drainOneUnderLoad(f, workers[1]!);
  });
});
