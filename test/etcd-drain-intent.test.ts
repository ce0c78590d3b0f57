/**
 * An operator's drain outlives the worker process on etcd: a worker restarted with the same id
 * comes back drained (not registered) until it is resumed. Real processes, a real etcd.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { INTENT_PREFIX } from '../src/discovery/drain-intent.js';
import { etcdSkipReason } from './helpers/etcd.js';
import { etcdFixture } from './helpers/etcd-fixture.js';
import { call } from './helpers/http.js';
import { NO_TOKEN } from './helpers/k8s-fixture.js';
import { runEbb, spawnEbb, type WorkerHandle } from './helpers/processes.js';

describe('etcd: a drain intent survives a restart', { skip: etcdSkipReason() }, () => {
  const fx = etcdFixture();
  const args = (id: string) => ['--model', 'm1', '--worker-id', id, '--lease-ttl-ms', '2000'];
  const worker = (id: string): Promise<WorkerHandle> => fx.worker(args(id));
  const registered = () => fx.registeredIds();
  const intent = async (id: string) => fx.raw.get(`${INTENT_PREFIX}${encodeURIComponent(id)}`).string();

  it('drain, SIGKILL, restart: drained and not registered; resume clears the intent, and the next restart serves', async () => {
    const first = await worker('w-intent');
    const mark = first.mark();
    assert.equal((await call('POST', `${first.systemUrl}/engine/drain`, { reason: 'disk swap' })).body.state, 'drained');
    await first.waitForEvent('state_changed', (l) => l.to === 'drained', { after: mark });
    // The intent is written as the drain begins; wait for etcd to hold it rather than assume.
    await fx.keyIs(`${INTENT_PREFIX}w-intent`, true);
    assert.match((await intent('w-intent')) ?? '', /disk swap/);
    first.signal('SIGKILL');
    await first.exitCode();

    const second = spawnEbb(['worker', '--port', '0', '--system-port', '0', '--discovery', fx.etcd.url, ...args('w-intent')], 'worker');
    fx.started.push(second);
    const drained = await second.waitForEvent('start_drained');
    assert.match(String(drained.reason), /drain intent .*disk swap/);
    const ready = await second.waitForEvent('worker_ready');
    const status = (await call('GET', `${ready.system_url as string}/engine/status`)).body;
    assert.equal(status.state, 'drained');
    assert.equal(status.discovery_registered, false);
    assert.deepEqual(await registered(), [], 'a restarted worker under a drain intent is not in discovery');

    assert.equal((await call('POST', `${ready.system_url as string}/engine/resume`)).body.state, 'serving');
    assert.deepEqual(await registered(), ['w-intent']);
    await fx.keyIs(`${INTENT_PREFIX}w-intent`, false);
    assert.equal(await intent('w-intent'), null, 'resume removed the intent');
    second.signal('SIGKILL');
    await second.exitCode();

    const third = await worker('w-intent');
    assert.equal((await call('GET', `${third.systemUrl}/engine/status`)).body.state, 'serving');
    assert.equal(third.indexOfEvent('start_drained'), -1);
  });

  it('a preStop drain (`ebb prestop`, then SIGTERM) leaves no intent: the worker restarted under the same id serves', async () => {
    const w = await worker('w-prestop');
    const hook = await runEbb(['prestop', '--system-url', w.systemUrl, '--timeout', '30s'], NO_TOKEN);
    assert.equal(hook.code, 0, `ebb prestop: ${hook.stderr}`);
    assert.match(hook.stdout, /worker w-prestop drained/);
    w.signal('SIGTERM');
    assert.equal(await w.exitCode(), 0);
    assert.equal(await intent('w-prestop'), null, 'no drain intent outlives the terminated process');
    // As a StatefulSet's pod or a systemd unit comes back: the same worker id.
    const again = await worker('w-prestop');
    assert.equal(again.indexOfEvent('start_drained'), -1, 'the restarted worker did not start drained');
    assert.equal((await call('GET', `${again.systemUrl}/engine/status`)).body.state, 'serving');
    assert.ok((await registered()).includes('w-prestop'), 'the restarted worker is in discovery');
  });

  it('a SIGTERM shutdown leaves no intent: the replacement serves', async () => {
    const w = await worker('w-term');
    w.signal('SIGTERM');
    assert.equal(await w.exitCode(), 0);
    assert.equal(await intent('w-term'), null);
    const again = await worker('w-term');
    assert.equal((await call('GET', `${again.systemUrl}/engine/status`)).body.state, 'serving');
  });
});
