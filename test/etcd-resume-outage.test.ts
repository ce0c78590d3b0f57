/**
 * Resume during an etcd outage, with real processes on a real etcd: the refused resume leaves the
 * worker drained, and once etcd is back the worker confirms it is out of discovery on its own.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { etcdSkipReason } from './helpers/etcd.js';
import { etcdFixture } from './helpers/etcd-fixture.js';
import { call } from './helpers/http.js';

describe('etcd: resume while etcd is down', { skip: etcdSkipReason() }, () => {
  const fx = etcdFixture();

  it('is refused, and the worker confirms its absence once etcd returns, without operator action', async () => {
    const w = await fx.worker(['--model', 'm1', '--lease-ttl-ms', '2000']);
    assert.deepEqual(await fx.registeredIds(), [w.workerId]);
    await fx.etcd.kill();
    const drain = await call('POST', `${w.systemUrl}/engine/drain`, { reason: 'etcd outage' });
    assert.equal(drain.body.discovery, 'unknown');
    const resume = await call('POST', `${w.systemUrl}/engine/resume`);
    assert.equal(resume.status, 502, JSON.stringify(resume.body));
    assert.equal(resume.body.error.code, 'discovery_unavailable');
    const after = (await call('GET', `${w.systemUrl}/engine/status`)).body;
    assert.equal(after.state, 'drained', 'a refused resume leaves the state as it was');
    assert.equal(after.admission_open, false);
    assert.equal(after.discovery, 'unknown');

    const mark = w.mark();
    await fx.etcd.restart();
    await w.waitForEvent('discovery_unregistered', () => true, { after: mark });
    const status = (await call('GET', `${w.systemUrl}/engine/status`)).body;
    assert.equal(status.discovery, 'unregistered');
    assert.equal(status.state, 'drained');
    assert.ok(!(await fx.registeredIds()).includes(w.workerId), 'a drained worker is not in etcd');
    // And the operator's next resume registers it.
    const resumed = await call('POST', `${w.systemUrl}/engine/resume`);
    assert.equal(resumed.body.discovery, 'registered');
  });
});
