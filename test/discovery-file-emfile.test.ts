/**
 * A frontend on file discovery that runs out of file descriptors must neither die (an unhandled
 * rejection from a directory scan) nor forget the workers it was routing to: a real frontend
 * process under a low `ulimit -n`, exhausted with idle client sockets.
 */
import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { FileDiscovery } from '../src/discovery/file.js';
import { call } from './helpers/http.js';
import { bounded, CLI, EbbProcess, tempDiscoveryUrl } from './helpers/processes.js';

/** Enough for node to load the frontend (module loading opens files in parallel), little enough to exhaust. */
const FD_LIMIT = 128;
const SOCKETS = 3 * FD_LIMIT;
const MODEL = 'emfile-model';

describe('file discovery under fd exhaustion', { skip: process.platform === 'win32' ? 'needs bash and ulimit' : undefined }, () => {
  const cleanups: Array<() => Promise<void> | void> = [];
  after(async () => {
    for (const c of cleanups.reverse()) await c();
  });

  it('the frontend survives EMFILE in a scan and keeps routing to the worker it knew', async () => {
    const url = tempDiscoveryUrl();
    const dir = fileURLToPath(url);
    const registrar = new FileDiscovery(dir, 3000);
    cleanups.push(() => registrar.close());
    await registrar.register({ worker_id: 'w-emfile', model: MODEL, mode: 'aggregated', request_url: 'http://127.0.0.1:9', system_url: 'http://127.0.0.1:9' });

    // The default connection cap (derived from the fd limit) would close the flood before it
    // exhausts anything; lift it so the scan itself meets EMFILE.
    const args = [CLI, 'frontend', '--port', '0', '--discovery', url, '--max-connections', '100000'];
    const proc = spawn('bash', ['-c', `ulimit -n ${FD_LIMIT}; exec "$0" "$@"`, process.execPath, ...args], {
      env: { ...process.env, EBB_LOG_LEVEL: 'info' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const frontend = new EbbProcess(proc, 'frontend (ulimit -n 128)');
    cleanups.push(() => frontend.stop());
    const base = (await frontend.waitForEvent('frontend_ready')).url as string;
    assert.deepEqual((await call('GET', `${base}/v1/models`)).body.data.map((m: { id: string }) => m.id), [MODEL]);

    let stderr = '';
    const scanFailed = bounded(
      new Promise<void>((resolve, reject) => {
        proc.stderr!.on('data', (chunk: Buffer) => {
          stderr += chunk.toString();
          if (stderr.includes('keeping the last view')) resolve();
        });
        proc.once('exit', (code, signal) => reject(new Error(`the frontend died (code ${code}, signal ${signal}):\n${stderr}`)));
      }),
      'a failed scan reported on the frontend’s stderr',
    );

    // Idle connections take every descriptor the frontend has left.
    const sockets: Socket[] = [];
    cleanups.push(() => sockets.forEach((s) => s.destroy()));
    const { hostname, port } = new URL(base);
    await Promise.all(
      Array.from({ length: SOCKETS }, () => {
        const s = connect(Number(port), hostname);
        s.on('error', () => undefined); // the frontend may shed some of them
        sockets.push(s);
        return new Promise<void>((resolve) => s.once('connect', resolve).once('error', () => resolve()));
      }),
    );
    writeFileSync(join(dir, 'poke.tmp'), ''); // a directory event: the frontend scans now
    await scanFailed;
    assert.match(stderr, /EMFILE/);
    assert.equal(proc.exitCode, null, 'the frontend is alive');

    for (const s of sockets) s.destroy();
    // The frontend notices the closed sockets in its own time; the first request that gets through must find the worker.
    const models = await bounded(
      (async () => {
        for (;;) {
          try {
            return (await call('GET', `${base}/v1/models`)).body.data.map((m: { id: string }) => m.id) as string[];
          } catch {
            await new Promise((resolve) => setTimeout(resolve, 100));
          }
        }
      })(),
      'the frontend to answer again',
    );
    assert.deepEqual(models, [MODEL]);
    assert.ok(!frontend.logs.some((l) => l.event === 'worker_removed'), 'the worker never left the routing view');
  });
});
