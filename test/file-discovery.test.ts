import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir, hostname } from 'node:os';
import { join } from 'node:path';
import { FileDiscovery } from '../src/discovery/file.js';
import type { DiscoveryEvent, WorkerRecord } from '../src/discovery/discovery.js';
import { bounded } from './helpers/processes.js';

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

/** Collects watch events and lets a test wait for one. */
function collector() {
  const events: DiscoveryEvent[] = [];
  const waiters: Array<[(e: DiscoveryEvent) => boolean, (e: DiscoveryEvent) => void]> = [];
  return {
    events,
    listener: (e: DiscoveryEvent) => {
      events.push(e);
      for (const [pred, resolve] of waiters) if (pred(e)) resolve(e);
    },
    next(pred: (e: DiscoveryEvent) => boolean): Promise<DiscoveryEvent> {
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
    writeFileSync(join(dir, 'quiet.json'), JSON.stringify({ record: record('quiet'), pid: process.pid, hostname: 'elsewhere', heartbeat_at: Date.now(), ttl_ms: 300 }));
    const c = collector();
    await reader.watch(c.listener);
    assert.deepEqual(c.events[0], { type: 'reset', records: [record('quiet')] });
    await c.next((e) => e.type === 'delete' && e.worker_id === 'quiet');
  });
});
