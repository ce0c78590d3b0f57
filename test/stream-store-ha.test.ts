import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { sseEvents } from './helpers/http.js';
import { execFileSync, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { clusterPorts, stablePort } from './helpers/ports.js';
import { frontendSeesWorkers, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle } from './helpers/processes.js';
import { skipWithout } from './helpers/required-tool.js';
import { spawnRedis } from './helpers/redis.js';

function toolsSkipReason(): string | undefined {
  let available = true;
  try {
    for (const tool of ['redis-sentinel', 'redis-server', 'redis-cli']) execFileSync(tool, ['--version'], { stdio: 'ignore' });
  } catch {
    available = false;
  }
  return skipWithout(available, 'redis-sentinel or redis-cli not installed: the Sentinel and Cluster stream-store tests are SKIPPED; install redis-sentinel and redis-tools');
}

const KEPT = { 'content-type': 'application/json', 'x-ebb-resumable': '1' };
const text = (e: string[]) => e.map((x) => /"delta":\{"content":("(?:[^"\\]|\\.)*")/.exec(x)?.[1]).filter((x) => x !== undefined).map((x) => JSON.parse(x!) as string).join('');

/**
 * A stream store that is not a single point of failure (issue 43 item 7): a master, its replica and
 * three Sentinels; frontends name the Sentinels (redis+sentinel://.../ebb). The master is SIGKILLed
 * under load: the streams run on, and once the replica is promoted, resumes at another frontend
 * are served whole.
 */
describe('the stream store behind Redis Sentinel: a master killed under load', { skip: toolsSkipReason() }, () => {
  const started: EbbProcess[] = [];
  const servers: ChildProcess[] = [];
  let master: ChildProcess;
  let url: string;
  let discovery: string;
  before(async () => {
    const [mPort, rPort, ...sPorts] = await Promise.all([0, 1, 2, 3, 4].map(() => stablePort()));
    master = await spawnRedis(mPort!, []);
    servers.push(master, await spawnRedis(rPort!, ['--replicaof', '127.0.0.1', String(mPort)]));
    const dir = mkdtempSync(join(tmpdir(), 'ebb-sentinel-'));
    for (const port of sPorts) {
      const conf = join(dir, `sentinel-${port}.conf`);
      writeFileSync(conf, [`port ${port}`, 'bind 127.0.0.1', `dir ${dir}`, `sentinel monitor ebb 127.0.0.1 ${mPort} 2`, 'sentinel down-after-milliseconds ebb 1000', 'sentinel failover-timeout ebb 5000', ''].join('\n'));
      servers.push(await spawnRedis(port, [conf], 'redis-sentinel', '+monitor master ebb'));
    }
    url = `redis+sentinel://${sPorts.map((p) => `127.0.0.1:${p}`).join(',')}/ebb`;
    discovery = tempDiscoveryUrl();
    started.push(...(await Promise.all([0, 1].map(() => startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '25', '--mocker-ttft-ms', '0', '--mocker-max-context', '100000'])))));
  });
  after(async () => {
    await Promise.all(started.map((p) => p.stop()));
    for (const s of servers) if (s.exitCode === null && s.signalCode === null) s.kill('SIGKILL');
  });

  const body = (seed: number) => JSON.stringify({ model: 'm1', messages: [{ role: 'user', content: 'tell me about the tides' }], max_tokens: 240, seed, stream: true });

  it('10 streams run on through the failover, 0 lost; after it, each is resumed whole at another frontend', async () => {
    const [a, b] = (await Promise.all([0, 1].map(() => startFrontend(discovery, ['--stream-store', url])))) as [FrontendHandle, FrontendHandle];
    started.push(a, b);
    await Promise.all([a, b].map((f) => frontendSeesWorkers(f, 2)));
    assert.ok(a.logs.some((l) => l.event === 'stream_store_connected' && l.kind === 'sentinel'), 'connected through the Sentinels');
    const seeds = Array.from({ length: 10 }, (_, i) => 40 + i);
    const reference = await Promise.all(seeds.map(async (seed) => text(await sseEvents(await fetch(`${b.url}/v1/chat/completions`, { method: 'POST', headers: KEPT, body: body(seed) })))));
    let begun = 0;
    let allBegun!: () => void;
    const ready = new Promise<void>((resolve) => (allBegun = resolve));
    const ids: string[] = [];
    const running = seeds.map(async (seed, i) =>
      sseEvents(await fetch(`${a.url}/v1/chat/completions`, { method: 'POST', headers: KEPT, body: body(seed) }), (e) => {
        if (ids[i] === undefined && /"id":"(chatcmpl-[0-9a-f]+)"/.test(e)) {
          ids[i] = /"id":"(chatcmpl-[0-9a-f]+)"/.exec(e)![1]!;
          if (++begun === seeds.length) allBegun();
        }
      }),
    );
    await ready;
    const mark = a.mark();
    const exited = once(master, 'exit');
    master.kill('SIGKILL');
    await exited;
    const done = await Promise.all(running);
    done.forEach((e, i) => assert.equal(text(e), reference[i], `stream ${i} ran on, whole, through the failover`));
    // The promoted replica serves the store again: every copy is whole (its writer rewrote what the failover lost).
    await a.waitForEvent('stream_store_available', () => true, { after: mark, boundMs: 60_000 });
    const resumed = await Promise.all(ids.map(async (id) => text(await sseEvents(await fetch(`${b.url}/v1/chat/completions/${id}?stream=true`)))));
    resumed.forEach((t, i) => assert.equal(t, reference[i], `stream ${i} resumed whole at the other frontend after the failover`));
  });
});

/** The stream store on a Redis Cluster (redis+cluster://): a shared stream's keys on one slot, its steps atomic there; a takeover across frontends. */
describe('the stream store on a Redis Cluster', { skip: toolsSkipReason() }, () => {
  const started: EbbProcess[] = [];
  const nodes: ChildProcess[] = [];
  let url: string;
  let discovery: string;
  before(async () => {
    const ports = await clusterPorts(3);
    const dir = mkdtempSync(join(tmpdir(), 'ebb-cluster-'));
    for (const port of ports) nodes.push(await spawnRedis(port, ['--cluster-enabled', 'yes', '--cluster-config-file', join(dir, `nodes-${port}.conf`), '--dir', dir]));
    execFileSync('redis-cli', ['--cluster', 'create', ...ports.map((p) => `127.0.0.1:${p}`), '--cluster-replicas', '0', '--cluster-yes'], { stdio: 'ignore' });
    // Ready once every node says the cluster is up (bounded).
    for (let waited = 0; ; waited += 100) {
      const states = ports.map((p) => execFileSync('redis-cli', ['-p', String(p), 'cluster', 'info']).toString());
      if (states.every((s) => s.includes('cluster_state:ok'))) break;
      if (waited > 20_000) throw new Error(`the cluster did not come up: ${states.join(' / ')}`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    url = `redis+cluster://${ports.map((p) => `127.0.0.1:${p}`).join(',')}`;
    discovery = tempDiscoveryUrl();
    started.push(await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '25', '--mocker-ttft-ms', '0', '--mocker-max-context', '100000']));
  });
  after(async () => {
    await Promise.all(started.map((p) => p.stop()));
    for (const n of nodes) if (n.exitCode === null && n.signalCode === null) n.kill('SIGKILL');
  });

  it('a stream whose frontend is SIGKILLed is resumed and taken over at another, as undisturbed', async () => {
    const [a, b] = (await Promise.all([0, 1].map(() => startFrontend(discovery, ['--stream-store', url])))) as [FrontendHandle, FrontendHandle];
    started.push(a, b);
    await Promise.all([a, b].map((f) => frontendSeesWorkers(f, 1)));
    assert.ok(a.logs.some((l) => l.event === 'stream_store_connected' && l.kind === 'cluster'), 'connected to the cluster');
    const post = (f: FrontendHandle) => fetch(`${f.url}/v1/chat/completions`, { method: 'POST', headers: KEPT, body: JSON.stringify({ model: 'm1', messages: [{ role: 'user', content: 'tides' }], max_tokens: 60, seed: 9, stream: true }) });
    // Several streams at once at b: on a Cluster each stream's batch is its own script (their keys are in different slots), never one for them all.
    const bMark = b.mark();
    const [reference, ...others] = (await Promise.all([0, 1, 2, 3].map(async () => text(await sseEvents(await post(b)))))) as [string, ...string[]];
    for (const other of others) assert.equal(other, reference, 'each stream at b whole');
    const rewrites = b.logs.slice(bMark).filter((l) => l.event === 'stream_lease' && l.to === 'rewrite');
    assert.deepEqual(rewrites.map((l) => l.why), [], 'no batch at b failed: none went to the cluster in a script with another stream\'s');
    let id = '';
    const first: string[] = [];
    await sseEvents(await post(a), (e) => {
      first.push(e);
      id ||= /"id":"(chatcmpl-[0-9a-f]+)"/.exec(e)?.[1] ?? '';
      if (e.startsWith('id: 10\n')) a.proc.kill('SIGKILL');
    }).catch(() => undefined);
    const mark = b.mark();
    const rest = await sseEvents(await fetch(`${b.url}/v1/chat/completions/${id}?stream=true`, { headers: { 'last-event-id': '10' } }));
    await b.waitForEvent('stream_taken_over', (l) => l.response_id === id, { after: mark });
    assert.equal(text(first.slice(0, 11)) + text(rest), reference);
  });
});
