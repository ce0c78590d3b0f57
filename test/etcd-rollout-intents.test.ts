/**
 * Drain intents and the operator, on a real etcd with real processes: a rollout whose hook restarts
 * the worker under the same id gets a serving replacement (the rollout's drain keeps no intent), and
 * an operator's drain that does outlive a restart can be listed, found, resumed and cleared.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { once } from 'node:events';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { promisify } from 'node:util';
import { INTENT_PREFIX } from '../src/discovery/drain-intent.js';
import { etcdSkipReason } from './helpers/etcd.js';
import { etcdFixture } from './helpers/etcd-fixture.js';
import { call } from './helpers/http.js';
import { CLI, spawnEbb, startFrontend, type WorkerHandle } from './helpers/processes.js';

const run = promisify(execFile);

describe('etcd: drain intents and the operator', { skip: etcdSkipReason() }, () => {
  const fx = etcdFixture();
  const ID = 'w-roll';
  const args = ['--model', 'm-roll', '--worker-id', ID, '--lease-ttl-ms', '2000', '--shutdown-grace-ms', '0'];
  let current: WorkerHandle;
  const ebb = async (...a: string[]) => (await run(process.execPath, [CLI, ...a, '--discovery', fx.etcd.url], { timeout: 30_000 })).stdout;
  /** Resolves once etcd holds (or no longer holds) the intent of ID: written after the drain answered. */
  const intentIs = (present: boolean) => fx.keyIs(`${INTENT_PREFIX}${ID}`, present);

  it('a rollout whose hook restarts the worker under the same id finishes: the replacement serves', async () => {
    current = await fx.worker(args);
    // The hook asks the test to restart the worker: SIGTERM, then the same id again.
    const restarts = createServer((req, res) => {
      void (async () => {
        current.signal('SIGTERM');
        await current.exitCode();
        current = await fx.worker(args);
        res.end('ok');
      })().catch((err: Error) => res.writeHead(500).end(err.message));
    });
    restarts.listen(0, '127.0.0.1');
    await once(restarts, 'listening');
    const hookUrl = `http://127.0.0.1:${(restarts.address() as AddressInfo).port}/restart`;
    const hook = `"${process.execPath}" -e "fetch('${hookUrl}',{method:'POST'}).then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"`;
    try {
      const rollout = spawnEbb(['rollout', '--model', 'm-roll', '--discovery', fx.etcd.url, '--then-exec', hook, '--timeout', '60s'], 'rollout');
      assert.equal(await rollout.exitCode(120_000), 0, rollout.stderr.join('\n'));
    } finally {
      restarts.close();
    }
    assert.equal(current.indexOfEvent('start_drained'), -1, 'the replacement did not start drained');
    assert.equal((await call('GET', `${current.systemUrl}/engine/status`)).body.state, 'serving');
    assert.deepEqual(JSON.parse(await ebb('intents', '--json')).intents, [], 'the rollout left no intent');
  });

  it('an operator drain outlives a restart: the drained, unregistered worker is listed, resumed by id, and intents can be cleared', async () => {
    assert.equal((await call('POST', `${current.systemUrl}/engine/drain`, { reason: 'disk swap' })).body.state, 'drained');
    await intentIs(true);
    current.signal('SIGKILL');
    await current.exitCode();
    const restarted = spawnEbb(['worker', '--port', '0', '--system-port', '0', '--discovery', fx.etcd.url, ...args], 'worker');
    fx.started.push(restarted);
    const ready = await restarted.waitForEvent('worker_ready');
    assert.deepEqual(await fx.registeredIds(), [], 'started drained: never registered');

    const fleet = JSON.parse(await ebb('workers', '--json')).workers as Array<Record<string, any>>;
    const listed = fleet.find((w) => w.worker_id === ID);
    assert.ok(listed, `the drained worker is listed: ${JSON.stringify(fleet)}`);
    assert.equal(listed.state, 'drained');
    assert.equal(listed.in_discovery, false);
    assert.equal(listed.system_url, ready.system_url, 'found at the URLs of the process running now');
    assert.match(listed.drain_intent.reason, /disk swap/);
    // Through a frontend too: it reads the intents discovery keeps, and resumes what it lists.
    const fe = await startFrontend(fx.etcd.url, ['--admin-port', '0']);
    fx.started.push(fe);
    const adminUrl = (await fe.waitForEvent('frontend_ready')).admin_url as string;
    const viaFrontend = (await run(process.execPath, [CLI, 'workers', '--json', '--frontend', adminUrl], { timeout: 30_000 })).stdout;
    const seen = (JSON.parse(viaFrontend).workers as Array<Record<string, any>>).find((w) => w.worker_id === ID);
    assert.ok(seen, `ebb workers --frontend lists the worker that never registered: ${viaFrontend}`);
    assert.deepEqual([seen.state, seen.in_discovery, seen.system_url, seen.drain_intent?.reason], ['drained', false, ready.system_url, 'disk swap']);
    assert.equal((await call('GET', `${adminUrl}/workers/${ID}`)).body.state, 'drained', 'and finds it by id');
    const intents = JSON.parse(await ebb('intents', '--json')).intents as Array<Record<string, any>>;
    assert.deepEqual(intents.map((i) => [i.worker_id, i.reason, i.worker?.system_url]), [[ID, 'disk swap', ready.system_url]]);
    assert.ok(Date.parse(intents[0]?.expires_at) > Date.now(), 'an intent says when it lapses');

    assert.match(await ebb('resume', ID), /serving/);
    await intentIs(false);
    assert.deepEqual(await fx.registeredIds(), [ID]);

    assert.equal((await call('POST', `${ready.system_url as string}/engine/drain`, { reason: 'again' })).body.state, 'drained');
    await intentIs(true);
    assert.match(await ebb('intents', 'clear', ID), new RegExp(`drain intent of ${ID} removed`));
    await intentIs(false);
    assert.match(await ebb('intents'), /no drain intents/);
    assert.equal((await call('GET', `${ready.system_url as string}/engine/status`)).body.state, 'drained', 'clearing an intent does not resume');
  });
});
