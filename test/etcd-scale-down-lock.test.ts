/**
 * The scale-down lock on etcd: `ebb scale-down` is refused while another holds it, and a holder
 * that dies (SIGKILL) frees it when its lease expires. Real processes, a real etcd.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { EtcdScaleDownLocks, SCALE_DOWN_LOCK_PREFIX } from '../src/discovery/scale-down-lock.js';
import { etcdSkipReason } from './helpers/etcd.js';
import { etcdFixture } from './helpers/etcd-fixture.js';
import { call } from './helpers/http.js';
import { runEbb, type WorkerHandle } from './helpers/processes.js';
import { dieWithFile } from './helpers/reaper.js';

const LOCK_MODULE = fileURLToPath(new URL('../src/discovery/scale-down-lock.js', import.meta.url));
const KEY = `${SCALE_DOWN_LOCK_PREFIX}m1`;

describe('etcd: one scale-down of a model at a time', { skip: etcdSkipReason() }, () => {
  const fx = etcdFixture();
  const scaleDown = () => runEbb(['scale-down', '--model', 'm1', '--count', '1', '--discovery', fx.etcd.url, '--json'], { EBB_ADMIN_TOKEN: undefined }, 60_000);
  const states = async (ws: WorkerHandle[]) => Promise.all(ws.map(async (w) => (await call('GET', `${w.systemUrl}/engine/status`)).body.state as string));

  it('refuses while the lock is held, drains once it is released, and a SIGKILLed holder frees it when its lease expires', async () => {
    const ws = [await fx.worker(['--model', 'm1', '--worker-id', 'w-a']), await fx.worker(['--model', 'm1', '--worker-id', 'w-b']), await fx.worker(['--model', 'm1', '--worker-id', 'w-c'])];
    const release = await new EtcdScaleDownLocks(fx.raw).acquire('m1', 'the test, holding it');
    try {
      const r = await scaleDown();
      assert.equal(r.code, 1, r.stderr);
      assert.match(r.stderr, /a scale-down of m1 is choosing and draining its victims \(the test, holding it\)/);
      assert.deepEqual(await states(ws), ['serving', 'serving', 'serving']);
    } finally {
      await release();
    }
    assert.equal(await fx.raw.get(KEY).string(), null, 'released: the key is gone');
    const ok = await scaleDown();
    assert.equal(ok.code, 0, ok.stderr);
    assert.equal(await fx.raw.get(KEY).string(), null, 'the command released it on its way out');

    // Another process takes the lock, says so, and is SIGKILLed holding it.
    const holder = dieWithFile(
      spawn(
        process.execPath,
        ['--input-type=module', '-e', `const { EtcdScaleDownLocks } = await import(${JSON.stringify(LOCK_MODULE)}); const { Etcd3 } = await import('etcd3'); await new EtcdScaleDownLocks(new Etcd3({ hosts: [${JSON.stringify(fx.etcd.endpoint)}] })).acquire('m1', 'a CLI about to be SIGKILLed'); console.log('held');`],
        { stdio: ['ignore', 'pipe', 'inherit'], cwd: fileURLToPath(new URL('..', import.meta.url)) },
      ),
    );
    const [line] = (await once(createInterface({ input: holder.stdout }), 'line')) as [string];
    assert.equal(line, 'held');
    const gone = await fx.raw.watch().key(KEY).create();
    const deleted = once(gone, 'delete');
    holder.kill('SIGKILL');
    await once(holder, 'exit');
    assert.equal(await fx.raw.get(KEY).string(), 'a CLI about to be SIGKILLed');
    await deleted; // its lease ran out (no keepalive from a dead process): etcd deleted the key
    await gone.cancel();
    const after = await scaleDown();
    assert.equal(after.code, 0, after.stderr);
    assert.equal((await states(ws)).filter((s) => s === 'serving').length, 1, 'two scale-downs by one: one of three serving');
  });
});
