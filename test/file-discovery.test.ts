import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { chmodSync, chownSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir, hostname } from 'node:os';
import { dirname, join } from 'node:path';
import { FileDiscovery } from '../src/discovery/file.js';
import { isWorkerRecord, type FleetEvent, type LoadingRecord, type WorkerRecord } from '../src/discovery/discovery.js';
import { bounded } from './helpers/processes.js';

/** A record file as another process would write it; `hostname: 'elsewhere'` so no pid check applies. */
function inject(dir: string, id: string, fields: Record<string, unknown> = {}, rec: Record<string, unknown> = {}): void {
  const entry = { record: { ...record(id), ...rec }, pid: process.pid, hostname: 'elsewhere', heartbeat_at: Date.now(), ttl_ms: 60_000, ...fields };
  writeFileSync(join(dir, `${id}.json`), JSON.stringify(entry));
}

/** Resolves with the next discovery warning this process emits (the only sign a failed scan leaves). */
function nextDiscoveryWarning(): Promise<Error> {
  return bounded(
    new Promise<Error>((resolve) => {
      const onWarning = (w: Error) => {
        if (w.name !== 'EbbDiscoveryWarning') return;
        process.off('warning', onWarning);
        resolve(w);
      };
      process.on('warning', onWarning);
    }),
    'a discovery warning',
  );
}

const record = (id: string): WorkerRecord => ({ worker_id: id, model: 'm', mode: 'aggregated', request_url: 'http://127.0.0.1:1', system_url: 'http://127.0.0.1:2' });
const dirs: FileDiscovery[] = [];
after(async () => {
  await Promise.all(dirs.map((d) => d.close()));
});

function fresh(ttlMs = 3000) {
  const dir = mkdtempSync(join(tmpdir(), 'ebb-file-disc-'));
  const d = new FileDiscovery(dir, ttlMs);
  dirs.push(d);
  return { dir, d };
}

/** Collects watch events (watch's, or watchAll's with loading records) and lets a test wait for one. */
function collector() {
  const events: FleetEvent[] = [];
  const waiters: Array<[(e: FleetEvent) => boolean, (e: FleetEvent) => void]> = [];
  return {
    events,
    listener: (e: FleetEvent) => {
      events.push(e);
      for (const [pred, resolve] of waiters) if (pred(e)) resolve(e);
    },
    next(pred: (e: FleetEvent) => boolean): Promise<FleetEvent> {
      const seen = events.find(pred);
      if (seen) return Promise.resolve(seen);
      return bounded(new Promise((resolve) => waiters.push([pred, resolve])), 'discovery event');
    },
  };
}

describe('file discovery', () => {
  it('registers, lists, watches and unregisters across instances', async () => {
    const { dir, d } = fresh();
    await d.register(record('a'));
    const reader = new FileDiscovery(dir);
    dirs.push(reader);
    const c = collector();
    await reader.watch(c.listener);
    assert.deepEqual(c.events[0], { type: 'reset', records: [record('a')] });
    await d.register(record('b'));
    await c.next((e) => e.type === 'put' && e.record.worker_id === 'b');
    await d.unregister('a');
    await c.next((e) => e.type === 'delete' && e.worker_id === 'a');
    assert.deepEqual((await reader.list()).map((r) => r.worker_id), ['b']);
  });

  it('a loading record: watchAll sees it, then the serving record replacing it; watch, list and readers older than it see only serving records', async () => {
    const { dir, d } = fresh();
    const reader = new FileDiscovery(dir);
    dirs.push(reader);
    const all = collector();
    const serving = collector();
    await reader.watchAll(all.listener);
    await reader.watch(serving.listener);
    const loading = (id: string): LoadingRecord => ({ worker_id: id, model: 'm', mode: 'decode', system_url: 'http://127.0.0.1:2', engine: 'llama-cpp', loading: { since: '2025-01-01T00:00:00.000Z' } });
    await d.register(loading('a'));
    await all.next((e) => e.type === 'loading' && e.record.worker_id === 'a');
    assert.deepEqual(await reader.list(), [], 'list holds serving records only');
    // A reader older than loading records checks each with isWorkerRecord: a record without a request URL is none to it.
    assert.equal(isWorkerRecord(JSON.parse(readFileSync(join(dir, 'a.json'), 'utf8')).record), false);
    const late = collector();
    await reader.watchAll(late.listener);
    assert.deepEqual(late.events[0], { type: 'reset', records: [], loading: [loading('a')] });
    await d.register(record('a'));
    await all.next((e) => e.type === 'put' && e.record.worker_id === 'a');
    // One that never comes up: its record goes while it loads.
    await d.register(loading('b'));
    await all.next((e) => e.type === 'loading' && e.record.worker_id === 'b');
    await d.unregister('b');
    await all.next((e) => e.type === 'delete' && e.worker_id === 'b');
    await d.register(record('c'));
    await serving.next((e) => e.type === 'put' && e.record.worker_id === 'c');
    assert.deepEqual(
      serving.events.map((e) => (e.type === 'put' ? `put ${e.record.worker_id}` : e.type)),
      ['reset', 'put a', 'put c'],
      'the serving watch never saw a loading record, nor the one that went while loading',
    );
    assert.deepEqual(serving.events[0], { type: 'reset', records: [] });
  });

  it('reports a re-registration even when the watcher never saw the record leave', async () => {
    const { dir, d } = fresh();
    const reader = new FileDiscovery(dir);
    dirs.push(reader);
    await d.register(record('a'));
    const c = collector();
    await reader.watch(c.listener);
    // Drain then resume, quicker than the watcher reads the directory: the content is identical.
    await d.unregister('a');
    await d.register(record('a'));
    await c.next((e) => e.type === 'put' && e.record.worker_id === 'a');
  });

  it('drops the record of a process that died without unregistering', async () => {
    const { dir } = fresh();
    const reader = new FileDiscovery(dir);
    dirs.push(reader);
    const c = collector();
    await reader.watch(c.listener);
    // A crashed owner: its pid is gone; its heartbeat is still fresh.
    const child = spawn(process.execPath, ['-e', '']);
    await once(child, 'exit');
    writeFileSync(join(dir, 'crashed.json'), JSON.stringify({ record: record('crashed'), pid: child.pid, hostname: hostname(), heartbeat_at: Date.now(), ttl_ms: 60_000 }));
    assert.deepEqual(await reader.list(), []);
    assert.ok(!c.events.some((e) => e.type === 'put' && e.record.worker_id === 'crashed'));
  });

  it('expires a record whose heartbeat stopped (another host, or a hung owner)', async () => {
    const { dir } = fresh();
    const reader = new FileDiscovery(dir);
    dirs.push(reader);
    // A TTL the first read cannot miss on a loaded machine (at 300 ms the record could be gone before it).
    writeFileSync(join(dir, 'quiet.json'), JSON.stringify({ record: record('quiet'), pid: process.pid, hostname: 'elsewhere', heartbeat_at: Date.now(), ttl_ms: 2000 }));
    const c = collector();
    await reader.watch(c.listener);
    assert.deepEqual(c.events[0], { type: 'reset', records: [record('quiet')] });
    await c.next((e) => e.type === 'delete' && e.worker_id === 'quiet');
  });

  it('does not trust implausible records: a heartbeat in the future, an absurd TTL, a URL that is not http(s)', async () => {
    const { dir } = fresh();
    const reader = new FileDiscovery(dir);
    dirs.push(reader);
    const tenYears = 10 * 365 * 24 * 3600 * 1000;
    inject(dir, 'sound');
    inject(dir, 'future', { heartbeat_at: Date.now() + tenYears });
    inject(dir, 'eternal', { heartbeat_at: Date.now() - 3_600_000, ttl_ms: tenYears });
    inject(dir, 'not-http', {}, { request_url: 'file:///etc/passwd' });
    inject(dir, 'bad-pid', { pid: -1 });
    assert.deepEqual((await reader.list()).map((r) => r.worker_id), ['sound']);
    const c = collector();
    await reader.watch(c.listener);
    assert.deepEqual(c.events[0], { type: 'reset', records: [record('sound')] });
  });

  it('refuses a directory that group or others can write, at construction and at first use', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'ebb-file-disc-'));
    chmodSync(dir, 0o777);
    assert.throws(() => new FileDiscovery(dir), /writable by group or others \(mode 777\)/);
    // Not there yet when constructed; someone else makes it world-writable before the first register.
    const later = join(mkdtempSync(join(tmpdir(), 'ebb-file-disc-')), 'later');
    const d = new FileDiscovery(later);
    dirs.push(d);
    mkdirSync(later);
    chmodSync(later, 0o775);
    await assert.rejects(d.register(record('a')), /writable by group or others/);
  });

  it('creates a missing directory private (0700) and accepts it', async () => {
    const dir = join(mkdtempSync(join(tmpdir(), 'ebb-file-disc-')), 'a', 'b');
    const d = new FileDiscovery(dir);
    dirs.push(d);
    await d.register(record('a'));
    assert.deepEqual((await d.list()).map((r) => r.worker_id), ['a']);
    assert.equal(statSync(dir).mode & 0o777, 0o700);
    assert.equal(statSync(dirname(dir)).mode & 0o777, 0o700, 'the parent it created too');
  });

  it('refuses a directory owned by another user', { skip: process.getuid?.() !== 0 ? 'needs root to give a directory to another uid' : undefined }, () => {
    const dir = mkdtempSync(join(tmpdir(), 'ebb-file-disc-'));
    chownSync(dir, 54321, 54321);
    assert.throws(() => new FileDiscovery(dir), /owned by uid 54321/);
  });

  it('a record that cannot be read keeps its place in the view; only a read showing it gone removes it', async () => {
    const { dir } = fresh();
    const reader = new FileDiscovery(dir);
    dirs.push(reader);
    inject(dir, 'steady');
    const c = collector();
    await reader.watch(c.listener);
    assert.deepEqual(c.events[0], { type: 'reset', records: [record('steady')] });
    // The file turns unreadable (EISDIR here; EMFILE or EIO in the wild) ...
    renameSync(join(dir, 'steady.json'), join(dir, 'steady.moved'));
    mkdirSync(join(dir, 'steady.json'));
    // ... and a later scan, which the next record's arrival proves has run, must not drop it.
    inject(dir, 'newcomer');
    await c.next((e) => e.type === 'put' && e.record.worker_id === 'newcomer');
    assert.ok(!c.events.some((e) => e.type === 'delete'), JSON.stringify(c.events));
    assert.deepEqual((await reader.list()).map((r) => r.worker_id), ['newcomer'], 'list() has no earlier view: it leaves the unreadable one out');
    // Readable again and absent: now it goes.
    rmSync(join(dir, 'steady.json'), { recursive: true });
    await c.next((e) => e.type === 'delete' && e.worker_id === 'steady');
  });

  it('a scan that fails keeps the whole view, and the process survives it', async () => {
    const { dir } = fresh();
    const reader = new FileDiscovery(dir);
    dirs.push(reader);
    inject(dir, 'survivor');
    const c = collector();
    await reader.watch(c.listener);
    // The directory cannot be listed any more (ENOTDIR here; EMFILE under fd exhaustion).
    const warned = nextDiscoveryWarning();
    rmSync(dir, { recursive: true });
    writeFileSync(dir, '');
    assert.match((await warned).message, /keeping the last view/);
    assert.deepEqual(c.events, [{ type: 'reset', records: [record('survivor')] }]);
    rmSync(dir);
  });

  it('a throwing watch listener does not kill the process, and later changes still arrive', async () => {
    const { dir } = fresh();
    const reader = new FileDiscovery(dir);
    dirs.push(reader);
    const c = collector();
    const warned = nextDiscoveryWarning();
    await reader.watch((e) => {
      c.listener(e);
      if (e.type === 'put' && e.record.worker_id === 'first') throw new Error('listener bug');
    });
    inject(dir, 'first');
    assert.match((await warned).message, /listener bug/);
    inject(dir, 'second');
    await c.next((e) => e.type === 'put' && e.record.worker_id === 'second');
  });
});
