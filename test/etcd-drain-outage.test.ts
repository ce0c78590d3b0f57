/**
 * Drain during an etcd outage, with real processes on a real etcd: closing admission needs no
 * discovery, the worker unregisters once etcd is back, and a drained worker's key does not return.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { etcdSkipReason } from './helpers/etcd.js';
import { etcdFixture } from './helpers/etcd-fixture.js';
import { call } from './helpers/http.js';
import type { WorkerHandle } from './helpers/processes.js';

describe('etcd: drain while etcd is down', { skip: etcdSkipReason() }, () => {
  const fx = etcdFixture();
  const worker = (args: string[] = []): Promise<WorkerHandle> => fx.worker(['--model', 'm1', '--lease-ttl-ms', '2000', ...args]);
  const keyedIds = () => fx.registeredIds();

  it('drains locally, refuses new work, unregisters when etcd returns, and stays out of etcd', async () => {
    const w = await worker();
    assert.deepEqual(await keyedIds(), [w.workerId]);
    await fx.etcd.kill();
    const drain = await call('POST', `${w.systemUrl}/engine/drain`, { reason: 'etcd outage' });
    assert.equal(drain.status, 200, JSON.stringify(drain.body));
    assert.equal(drain.body.state, 'drained');
    assert.equal(drain.body.admission_open, false);
    assert.equal(drain.body.discovery, 'unknown');
    assert.equal(drain.body.discovery_registered, false);
    const refused = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'x' });
    assert.equal(refused.status, 503);
    assert.equal(refused.body.error.code, 'worker_draining');

    const mark = w.logs.length;
    await fx.etcd.restart();
    await w.waitForLog((l) => l.event === 'discovery_unregistered' && w.logs.indexOf(l) >= mark, 'unregister confirmed after etcd returned');
    assert.equal((await call('GET', `${w.systemUrl}/engine/status`)).body.discovery, 'unregistered');
    // A later registration (a newer revision) is visible, and the drained worker's key is not.
    const other = await worker();
    const ids = await keyedIds();
    assert.ok(ids.includes(other.workerId));
    assert.ok(!ids.includes(w.workerId), `a drained worker's key must not come back: ${ids.join(',')}`);

    const resumed = await call('POST', `${w.systemUrl}/engine/resume`);
    assert.equal(resumed.status, 200);
    assert.equal(resumed.body.discovery, 'registered');
    assert.ok((await keyedIds()).includes(w.workerId));
  });

  it('SIGTERM during a drain that cannot unregister: admission never reopens and the worker exits 0', async () => {
    const w = await worker(['--shutdown-grace-ms', '0', '--drain-timeout-ms', '10000']);
    await fx.etcd.kill();
    try {
      const drain = await call('POST', `${w.systemUrl}/engine/drain`);
      assert.equal(drain.body.state, 'drained');
      w.signal('SIGTERM');
      await w.waitForEvent('shutdown_started');
      const refused = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'x' });
      assert.equal(refused.body.error.code, 'worker_draining');
      assert.equal(await w.exitCode(), 0);
      const unregister = await w.waitForEvent('shutdown_stage', (l) => l.stage === 'unregister');
      assert.equal(unregister.outcome, 'timed_out');
      assert.ok(!w.logs.some((l) => l.event === 'state_changed' && l.to === 'serving' && l.from !== 'loading'), 'never back to serving');
    } finally {
      await fx.etcd.restart();
    }
  });
});
