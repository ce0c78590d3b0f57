import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Etcd3 } from 'etcd3';
import type { DiscoveryEvent, FleetEvent, LoadingRecord, WorkerRecord } from '../src/discovery/discovery.js';
import { ETCD_PREFIX, EtcdDiscovery, etcdKey, parseEtcdUrl, workerIdFromKey } from '../src/discovery/etcd.js';
import { etcdSkipReason, startEtcd, type EtcdServer } from './helpers/etcd.js';
import { dieWithFile } from './helpers/reaper.js';

/** Every wait is bounded so a broken behaviour fails the test instead of hanging it. */
const BOUND_MS = 20_000;

function record(workerId: string, model = 'org/model-a'): WorkerRecord {
  return {
    worker_id: workerId,
    model,
    mode: 'aggregated',
    request_url: `http://127.0.0.1:9/${workerId}`,
    system_url: `http://127.0.0.1:9`, // a bare origin: records whose system_url has a path are ignored
  };
}

function within<T>(work: Promise<T>, label: string, ms = BOUND_MS): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${label}`)), ms);
  });
  return Promise.race([work, timeout]).finally(() => clearTimeout(timer));
}

/** Retries an operation that may fail while etcd or the client recovers (not a sleep: it stops at the first success). */
async function eventually<T>(label: string, op: () => Promise<T>, ms = BOUND_MS): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    try {
      return await op();
    } catch (err) {
      if (Date.now() > deadline) throw new Error(`${label} kept failing for ${ms} ms: ${String(err)}`);
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }
}

/** Records events, keeps the view a frontend would build from them, and lets a test await a condition. */
class Recorder {
  readonly events: DiscoveryEvent[] = [];
  readonly view = new Map<string, WorkerRecord>();
  private waiters: Array<() => void> = [];

  readonly listener = (event: DiscoveryEvent): void => {
    this.events.push(event);
    if (event.type === 'reset') {
      this.view.clear();
      for (const r of event.records) this.view.set(r.worker_id, r);
    } else if (event.type === 'put') {
      this.view.set(event.record.worker_id, event.record);
    } else {
      this.view.delete(event.worker_id);
    }
    for (const wake of this.waiters) wake();
  };

  /** Resolves with the first event at index >= since matching pred. */
  event(label: string, pred: (e: DiscoveryEvent) => boolean, since = 0): Promise<DiscoveryEvent> {
    return this.until(label, () => this.events.slice(since).find(pred));
  }

  until<T>(label: string, check: () => T | undefined | false): Promise<T> {
    return within(
      new Promise<T>((resolve) => {
        const wake = () => {
          const v = check();
          if (v === undefined || v === false) return;
          this.waiters = this.waiters.filter((w) => w !== wake);
          resolve(v);
        };
        this.waiters.push(wake);
        wake();
      }),
      `${label}; events so far: ${JSON.stringify(this.events)}`,
    );
  }
}

function idsOf(e: DiscoveryEvent): string[] {
  return e.type === 'reset' ? e.records.map((r) => r.worker_id) : [];
}

/** Waits for onRegistrationLost for each of the given ids. */
function lostAll(d: EtcdDiscovery, ids: string[]): Promise<string[]> {
  const seen = new Set<string>();
  let off = (): void => undefined;
  return within(
    new Promise<string[]>((resolve) => {
      off = d.onRegistrationLost((id) => {
        seen.add(id);
        if (ids.every((i) => seen.has(i))) resolve([...seen].sort());
      });
    }),
    `onRegistrationLost(${ids.join(', ')})`,
  ).finally(() => off());
}

async function leaseOf(raw: Etcd3, r: WorkerRecord): Promise<string | undefined> {
  const res = await raw.get(etcdKey(r)).exec();
  return res.kvs[0]?.lease;
}

async function unusedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  const addr = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (addr === null || typeof addr === 'string') throw new Error('no port');
  return addr.port;
}

describe('etcd discovery: keys and URLs', () => {
  test('keys are <prefix><model>/<worker_id>, encoded both ways', () => {
    const r = record('w/1 é', 'meta-llama/Llama-3-8B');
    const key = etcdKey(r);
    assert.equal(key, `${ETCD_PREFIX}meta-llama%2FLlama-3-8B/w%2F1%20%C3%A9`);
    assert.equal(workerIdFromKey(key), 'w/1 é');
    assert.equal(workerIdFromKey('/other/prefix/x'), undefined);
  });

  test('URLs with one or several hosts', () => {
    assert.deepEqual(parseEtcdUrl('etcd://10.0.0.1:2379'), ['http://10.0.0.1:2379']);
    assert.deepEqual(parseEtcdUrl('etcd://a:1,b:2/'), ['http://a:1', 'http://b:2']);
    assert.deepEqual(parseEtcdUrl('etcd://a'), ['http://a:2379']);
    assert.throws(() => parseEtcdUrl('etcd://'), /no etcd host/);
  });

  test('an unreachable etcd fails register with an error naming the URL, and close() still returns', async () => {
    const url = `etcd://127.0.0.1:${await unusedPort()}`;
    const d = await EtcdDiscovery.connect(url, { leaseTtlMs: 2000 });
    try {
      await assert.rejects(within(d.register(record('nowhere')), 'register to fail'), (err: Error) => {
        assert.ok(err.message.includes(url), err.message);
        return true;
      });
    } finally {
      await within(d.close(), 'close');
    }
  });
});

describe('etcd discovery against a real etcd', { skip: etcdSkipReason() }, () => {
  let etcd: EtcdServer;
  let raw: Etcd3;

  before(async () => {
    etcd = await startEtcd();
    raw = new Etcd3({ hosts: [etcd.endpoint] });
  });
  after(async () => {
    raw?.close();
    await etcd?.stop();
  });

  test('register, list, unregister; keys under /ebb/v1/instances/<model>/<worker_id> on one lease', async (t) => {
    const d = await EtcdDiscovery.connect(etcd.url, {});
    t.after(() => d.close());
    const a = record('basic-a', 'org/basic');
    const b = record('basic-b', 'org/basic');
    await d.register(a);
    await d.register(b);

    const listed = (await d.list()).filter((r) => r.model === 'org/basic');
    assert.deepEqual(listed.sort((x, y) => x.worker_id.localeCompare(y.worker_id)), [a, b]);

    const key = '/ebb/v1/instances/org%2Fbasic/basic-a';
    assert.deepEqual(JSON.parse((await raw.get(key).string()) ?? 'null'), a);
    const leaseA = await leaseOf(raw, a);
    assert.ok(leaseA && leaseA !== '0', 'the key is bound to a lease');
    assert.equal(await leaseOf(raw, b), leaseA, 'one lease per process');

    await d.unregister('basic-a');
    assert.equal(await raw.get(key).string(), null);
    assert.deepEqual((await d.list()).filter((r) => r.model === 'org/basic'), [b]);
    assert.ok(await leaseOf(raw, b), 'unregister must not revoke the shared lease');
  });

  test('a loading record under the key its serving record then takes: watchAll sees both, watch and list only the serving one', async (t) => {
    const model = 'org/loading';
    const registrar = await EtcdDiscovery.connect(etcd.url, {});
    const watcher = await EtcdDiscovery.connect(etcd.url, {});
    t.after(() => Promise.all([registrar.close(), watcher.close()]));
    const loading = (id: string): LoadingRecord => ({ worker_id: id, model, mode: 'decode', system_url: 'http://127.0.0.1:9', loading: { since: '2025-01-01T00:00:00.000Z' } });
    await registrar.register(loading('ld-early'));
    const leaseId = await leaseOf(raw, record('ld-early', model));
    assert.ok(leaseId !== undefined && leaseId !== '0', "on the registrar's lease: it goes with the process");
    const all: FleetEvent[] = [];
    let wake: Array<() => void> = [];
    const seen = (label: string, pred: (e: FleetEvent) => boolean) =>
      within(
        new Promise<void>((resolve) => {
          const check = () => (all.some(pred) ? resolve() : void wake.push(check));
          check();
        }),
        `watchAll: ${label}; events so far: ${JSON.stringify(all)}`,
      );
    const serving = new Recorder();
    const wa = await watcher.watchAll((e) => {
      all.push(e);
      const woken = wake;
      wake = [];
      for (const w of woken) w();
    });
    const ws = await watcher.watch(serving.listener);
    t.after(() => Promise.all([wa.close(), ws.close()]));
    const reset = all[0];
    assert.equal(reset?.type, 'reset');
    assert.deepEqual(reset?.type === 'reset' ? reset.loading?.filter((r) => r.model === model) : undefined, [loading('ld-early')]);
    assert.deepEqual(reset?.type === 'reset' ? reset.records.filter((r) => r.model === model) : undefined, []);
    assert.equal((await watcher.list()).filter((r) => r.model === model).length, 0, 'list: serving records only');
    await registrar.register(record('ld-early', model));
    await serving.until('the serving record', () => serving.view.get('ld-early'));
    await seen('the serving record', (e) => e.type === 'put' && e.record.worker_id === 'ld-early');
    // One that never comes up: loading, then gone.
    await registrar.register(loading('ld-never'));
    await registrar.unregister('ld-never');
    await registrar.register(record('ld-after', model));
    await serving.until('the record registered after', () => serving.view.get('ld-after'));
    await seen('the record registered after', (e) => e.type === 'put' && e.record.worker_id === 'ld-after');
    assert.deepEqual(
      serving.events.filter((e) => e.type !== 'reset').map((e) => (e.type === 'put' ? `put ${e.record.worker_id}` : `delete ${e.worker_id}`)),
      ['put ld-early', 'put ld-after'],
      'the serving watch never saw a loading record, nor the one that went while loading',
    );
    const ofNever = all.filter((e) => (e.type === 'loading' && e.record.worker_id === 'ld-never') || (e.type === 'delete' && e.worker_id === 'ld-never')).map((e) => e.type);
    assert.deepEqual(ofNever, ['loading', 'delete']);
  });

  test('watch: reset with existing records, then put and delete from another client; close() revokes', async (t) => {
    const model = 'org/watch';
    const registrar = await EtcdDiscovery.connect(etcd.url, {});
    const other = await EtcdDiscovery.connect(etcd.url, {});
    const watcher = await EtcdDiscovery.connect(etcd.url, {});
    t.after(() => Promise.all([registrar.close(), other.close(), watcher.close()]));
    const existing = record('watch-existing', model);
    await registrar.register(existing);

    const rec = new Recorder();
    const w = await watcher.watch(rec.listener);
    t.after(() => w.close());
    const first = rec.events[0];
    assert.equal(first?.type, 'reset', 'the first event is a reset, delivered before watch() resolves');
    assert.ok(idsOf(first).includes('watch-existing'));

    const added = record('watch-added', model);
    await other.register(added);
    assert.deepEqual(await rec.event('put watch-added', (e) => e.type === 'put' && e.record.worker_id === 'watch-added'), {
      type: 'put',
      record: added,
    });
    await other.unregister('watch-added');
    await rec.event('delete watch-added', (e) => e.type === 'delete' && e.worker_id === 'watch-added');

    // A graceful close revokes the lease: the record goes at once, not after the TTL.
    await registrar.close();
    await rec.event('delete watch-existing', (e) => e.type === 'delete' && e.worker_id === 'watch-existing');
  });

  test('a crashed registrar (never revoked its lease) disappears after the lease TTL', async (t) => {
    const watcher = await EtcdDiscovery.connect(etcd.url, {});
    t.after(() => watcher.close());
    const rec = new Recorder();
    const w = await watcher.watch(rec.listener);
    t.after(() => w.close());

    const crashed = record('crash-victim', 'org/crash');
    const moduleUrl = new URL('../src/discovery/etcd.js', import.meta.url).href;
    const script = `
      import { EtcdDiscovery } from ${JSON.stringify(moduleUrl)};
      const d = await EtcdDiscovery.connect(process.env.ETCD_URL, { leaseTtlMs: 2000 });
      await d.register(JSON.parse(process.env.RECORD));
      process.stdout.write('registered\\n');
      setInterval(() => undefined, 1 << 30);
    `;
    const child = dieWithFile(
      spawn(process.execPath, ['--input-type=module', '-e', script], {
        env: { ...process.env, ETCD_URL: etcd.url, RECORD: JSON.stringify(crashed) },
        stdio: ['ignore', 'pipe', 'inherit'],
      }),
    );
    t.after(() => void child.kill('SIGKILL'));
    await within(
      new Promise<void>((resolve, reject) => {
        child.stdout.on('data', (chunk: Buffer) => chunk.toString().includes('registered') && resolve());
        child.once('exit', (code) => reject(new Error(`registrar exited early with ${code}`)));
      }),
      'the child registrar',
    );
    await rec.event('put crash-victim', (e) => e.type === 'put' && e.record.worker_id === 'crash-victim');

    const exited = new Promise((resolve) => child.once('exit', resolve));
    child.kill('SIGKILL');
    await within(exited, 'the child to die');
    await rec.event('delete crash-victim after TTL', (e) => e.type === 'delete' && e.worker_id === 'crash-victim');
    assert.ok(!(await watcher.list()).some((r) => r.worker_id === 'crash-victim'));
  });

  test('a lease revoked behind our back: onRegistrationLost fires and re-registering uses a fresh lease', async (t) => {
    const model = 'org/revoked';
    const registrar = await EtcdDiscovery.connect(etcd.url, { leaseTtlMs: 2000 });
    const watcher = await EtcdDiscovery.connect(etcd.url, {});
    t.after(() => Promise.all([registrar.close(), watcher.close()]));
    const rec = new Recorder();
    const w = await watcher.watch(rec.listener);
    t.after(() => w.close());

    const a = record('revoked-a', model);
    const b = record('revoked-b', model);
    await registrar.register(a);
    await registrar.register(b);
    const oldLease = await leaseOf(raw, a);
    assert.ok(oldLease);

    // An operator (or etcd after a long partition) kills the lease: the next keepalive reports it gone.
    const lost = lostAll(registrar, ['revoked-a', 'revoked-b']);
    await raw.leaseClient.leaseRevoke({ ID: oldLease });
    assert.deepEqual(await lost, ['revoked-a', 'revoked-b']);
    await rec.until('both records deleted', () => !rec.view.has('revoked-a') && !rec.view.has('revoked-b'));

    // The worker decides: it re-registers only a (b was, say, draining).
    const since = rec.events.length;
    await registrar.register(a);
    await rec.event('put revoked-a again', (e) => e.type === 'put' && e.record.worker_id === 'revoked-a', since);
    const newLease = await leaseOf(raw, a);
    assert.ok(newLease && newLease !== oldLease, `fresh lease expected, got ${newLease} (old ${oldLease})`);
    assert.equal(await leaseOf(raw, b), undefined, 'nobody re-put b behind the worker’s back');
  });
});

describe('etcd discovery across etcd restarts', { skip: etcdSkipReason() }, () => {
  let etcd: EtcdServer;
  before(async () => {
    etcd = await startEtcd();
  });
  after(async () => {
    await etcd?.stop();
  });

  test('after a restart the watcher resynchronises and new registrations show up', async (t) => {
    const watcher = await EtcdDiscovery.connect(etcd.url, {});
    const registrar = await EtcdDiscovery.connect(etcd.url, {}); // default 10 s TTL: survives a quick restart
    t.after(() => Promise.all([registrar.close(), watcher.close()]));
    const rec = new Recorder();
    const w = await watcher.watch(rec.listener);
    t.after(() => w.close());
    await registrar.register(record('before-restart'));
    await rec.until('before-restart visible', () => rec.view.has('before-restart'));

    const since = rec.events.length;
    await etcd.restart();
    // The watch stream broke; on reconnecting the discovery lists again and says so with a reset.
    const reset = await rec.event('a reset after the restart', (e) => e.type === 'reset', since);
    // etcd persists leases and renews them when it starts: a short outage does not lose the record.
    assert.ok(idsOf(reset).includes('before-restart'), JSON.stringify(reset));

    const fresh = await EtcdDiscovery.connect(etcd.url, {});
    t.after(() => fresh.close());
    await eventually('register after restart', () => fresh.register(record('after-restart')));
    await rec.until('after-restart visible', () => rec.view.has('after-restart'));
    // The pre-restart registrar's client recovers too (its circuit breaker may need a few seconds).
    await eventually('old registrar registers again', () => registrar.register(record('before-restart-2')));
    await rec.until('before-restart-2 visible', () => rec.view.has('before-restart-2'));
    assert.ok(rec.view.has('before-restart'));
  });

  test('etcd down for longer than the lease: onRegistrationLost, then re-registration survives the old lease', async (t) => {
    const raw = new Etcd3({ hosts: [etcd.endpoint] });
    const watcher = await EtcdDiscovery.connect(etcd.url, {});
    const registrar = await EtcdDiscovery.connect(etcd.url, { leaseTtlMs: 2000 });
    t.after(() => Promise.all([registrar.close(), watcher.close()]).then(() => raw.close()));
    const rec = new Recorder();
    const w = await watcher.watch(rec.listener);
    t.after(() => w.close());

    const serving = record('down-serving');
    const draining = record('down-draining');
    await registrar.register(serving);
    await registrar.register(draining);
    const oldLease = await leaseOf(raw, serving);
    await rec.until('both visible', () => rec.view.has('down-serving') && rec.view.has('down-draining'));

    // A restart does not lose a lease (etcd renews leases on startup), so keep etcd down until
    // the client gives up on it: etcd3 declares a lease lost after 2 x TTL without a keepalive.
    const lost = lostAll(registrar, ['down-serving', 'down-draining']);
    await etcd.kill();
    assert.deepEqual(await lost, ['down-draining', 'down-serving']);
    const since = rec.events.length;
    await etcd.restart();
    await rec.event('a reset after etcd came back', (e) => e.type === 'reset', since);

    // Only the serving worker comes back; registering grants a new lease (retry: the client's
    // circuit breaker stays open for a few seconds after the outage).
    await eventually('re-register the serving worker', () => registrar.register(serving));
    const newLease = await leaseOf(raw, serving);
    assert.ok(newLease && newLease !== oldLease, `fresh lease expected, got ${newLease} (old ${oldLease})`);

    // The old lease came back with etcd (it renews leases on startup). The registrar revokes it
    // once etcd answers again (its watch reconnects, or this register succeeds); it would otherwise
    // expire a TTL later. That takes the draining worker's key; the serving worker's key is on the
    // new lease (if the revoke came first, the serving key reappears with the re-registration).
    await eventually('the old lease to expire', async () => {
      const ttl = await raw.leaseClient.leaseTimeToLive({ ID: oldLease ?? '0' });
      if (ttl.TTL !== '-1') throw new Error(`old lease still has TTL ${ttl.TTL}`);
    });
    await rec.until('draining gone, serving present', () => !rec.view.has('down-draining') && rec.view.has('down-serving'));
    const listed = (await watcher.list()).map((r) => r.worker_id);
    assert.ok(listed.includes('down-serving') && !listed.includes('down-draining'), JSON.stringify(listed));
  });
});

describe('etcd discovery: what this process believes it holds matches etcd', { skip: etcdSkipReason() }, () => {
  let etcd: EtcdServer;
  let raw: Etcd3;
  before(async () => {
    etcd = await startEtcd();
    raw = new Etcd3({ hosts: [etcd.endpoint] });
  });
  after(async () => {
    raw?.close();
    await etcd?.stop();
  });

  test('a key deleted behind the worker’s back fires onRegistrationLost; its own unregister does not', async (t) => {
    const d = await EtcdDiscovery.connect(etcd.url, {});
    t.after(() => d.close());
    const mine = record('behind-mine', 'org/behind');
    const victim = record('behind-victim', 'org/behind');
    await d.register(mine);
    await d.register(victim);
    const seen: string[] = [];
    const off = d.onRegistrationLost((id) => seen.push(id));
    t.after(off);

    const lost = lostAll(d, ['behind-victim']);
    await d.unregister('behind-mine');
    await raw.delete().key(etcdKey(victim)).exec(); // an operator's etcdctl del
    assert.deepEqual(await lost, ['behind-victim']);
    // Watch events arrive in revision order, so a false alarm for our own delete would have come first.
    assert.deepEqual(seen, ['behind-victim']);
    // The lease is alive (only the key went): re-registering puts the key back.
    await d.register(victim);
    assert.deepEqual(JSON.parse((await raw.get(etcdKey(victim)).string()) ?? 'null'), victim);
  });

  test('a throwing watch listener does not kill the process or the watch, not even on the reset after a reconnect', async (t) => {
    const registrar = await EtcdDiscovery.connect(etcd.url, {});
    const watcher = await EtcdDiscovery.connect(etcd.url, {});
    t.after(() => Promise.all([registrar.close(), watcher.close()]));
    const rec = new Recorder();
    let resets = 0;
    const w = await watcher.watch((e) => {
      rec.listener(e);
      if (e.type === 'reset' && ++resets > 1) throw new Error('listener bug on reset');
      if (e.type === 'put' && e.record.worker_id === 'throw-first') throw new Error('listener bug on put');
    });
    t.after(() => w.close());
    await registrar.register(record('throw-first', 'org/throw'));
    const since = rec.events.length;
    await etcd.restart();
    await rec.event('the reset after the restart', (e) => e.type === 'reset', since);
    await eventually('register after the restart', () => registrar.register(record('throw-second', 'org/throw')));
    await rec.until('the put after the throwing reset', () => rec.view.has('throw-second'));
  });

  test('a drain rolled back during an outage: the failed unregister keeps the registration, so its loss is reported', async (t) => {
    const d = await EtcdDiscovery.connect(etcd.url, { leaseTtlMs: 2000 });
    t.after(() => d.close());
    const r = record('rollback-victim', 'org/rollback');
    await d.register(r);
    const lost = lostAll(d, ['rollback-victim']);
    await etcd.kill();
    t.after(() => etcd.restart());
    // The drain's unregister fails; the lifecycle rolls back to serving and keeps its registration.
    await assert.rejects(within(d.unregister('rollback-victim'), 'unregister to fail'), /unregister rollback-victim failed/);
    // The lease runs out while etcd is still down: the worker must hear of it to register again.
    assert.deepEqual(await lost, ['rollback-victim']);
  });

  test('a drained worker’s key does not come back after an etcd restart: its lost lease is revoked', async (t) => {
    const d = await EtcdDiscovery.connect(etcd.url, { leaseTtlMs: 3000 });
    t.after(() => d.close());
    const r = record('drained-victim', 'org/drained');
    await eventually('register (etcd may just have restarted)', () => d.register(r));
    const oldLease = await eventually('read the lease', () => leaseOf(raw, r));
    assert.ok(oldLease);
    const lost = lostAll(d, ['drained-victim']);
    await etcd.kill();
    await lost;
    // Drain during the outage: the unregister fails, the lifecycle drains locally and retries it.
    await assert.rejects(within(d.unregister('drained-victim'), 'unregister to fail'), /failed/);
    await etcd.restart();
    // etcd renews leases on startup: the old key is back for one TTL unless the lost lease is revoked.
    await eventually('the retried unregister', () => d.unregister('drained-victim'));
    const ttl = await eventually('lease TTL', () => raw.leaseClient.leaseTimeToLive({ ID: oldLease }));
    assert.equal(ttl.TTL, '-1', `the lost lease ${oldLease} must be revoked by now, it has TTL ${ttl.TTL}`);
    assert.equal(await raw.get(etcdKey(r)).string(), null);
  });
});

describe('etcd discovery: etcd restored from a backup', { skip: etcdSkipReason() }, () => {
  let etcd: EtcdServer;
  before(async () => {
    etcd = await startEtcd();
  });
  after(async () => {
    await etcd?.stop();
  });

  test('a key missing when the watch reconnects (lease alive) fires onRegistrationLost for that worker only', async (t) => {
    const d = await EtcdDiscovery.connect(etcd.url, {}); // 10 s lease: it outlives both restarts
    t.after(() => d.close());
    const old = record('restore-old', 'org/restore');
    const recent = record('restore-recent', 'org/restore');
    await d.register(old);
    const backup = await etcd.backup(); // holds the lease and the old key
    await eventually('register after the backup', () => d.register(recent));
    const seen: string[] = [];
    t.after(d.onRegistrationLost((id) => seen.push(id)));
    const lost = lostAll(d, ['restore-recent']);
    // The operator restores the backup: the lease is still there (so keepalives go on), the recent key is not.
    await etcd.restore(backup);
    assert.deepEqual(await lost, ['restore-recent']);
    assert.deepEqual(seen, ['restore-recent'], 'the key still in etcd is not reported lost');
  });
});
