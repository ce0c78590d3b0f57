import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { connect, type Socket } from 'node:net';
import { defaultMaxConnections, listenBacklog } from '../src/common/http-server.js';
import { bounded, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess } from './helpers/processes.js';

const procs: EbbProcess[] = [];
after(async () => {
  for (const p of procs) p.proc.kill('SIGCONT');
  await Promise.all(procs.map((p) => p.stop()));
});

/**
 * More than Node's default backlog (511), within what this kernel allows a listener and what the
 * listeners admit (their connection budget comes from the fd limit, which this process shares).
 */
const BURST = Math.min(1000, listenBacklog() - 16, defaultMaxConnections('public') - 16);
/** Where the kernel caps every listener at 511 or less, Node's default and ours are the same queue. */
const skip =
  BURST <= 511 && `a burst past 511 does not fit here (net.core.somaxconn ${listenBacklog()}, connection budget ${defaultMaxConnections('public')} from the fd limit)`;

/**
 * Opens BURST connections to `port` while `p` is stopped: only the kernel's accept queue can take
 * them, so every one connects only when the listener asked for a queue that long. Once `p` runs
 * again, the last one queued asks for `path`: the status it gets.
 */
async function lastOfBurstWhileStopped(p: EbbProcess, port: number, path: string): Promise<number> {
  p.proc.kill('SIGSTOP');
  const sockets = Array.from({ length: BURST }, () => connect(port, '127.0.0.1'));
  try {
    try {
      await bounded(Promise.all(sockets.map((s) => new Promise((resolve, reject) => s.once('connect', resolve).once('error', reject)))), `${BURST} connections queued by the kernel`);
    } finally {
      p.proc.kill('SIGCONT');
    }
    return await bounded(statusOn(sockets[sockets.length - 1]!, path), 'the last queued connection answered');
  } finally {
    for (const s of sockets) s.destroy();
  }
}

/** One HTTP exchange on an already open socket: the status line's code. */
function statusOn(socket: Socket, path: string): Promise<number> {
  return new Promise((resolve, reject) => {
    let head = '';
    socket.on('data', (d: Buffer) => {
      head += d.toString('latin1');
      const m = /^HTTP\/1\.1 (\d{3})/.exec(head);
      if (m) resolve(Number(m[1]));
    });
    socket.once('error', reject);
    socket.write(`GET ${path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n`);
  });
}

describe('listen backlog', () => {
  it('a burst of connections to a frontend that cannot accept for a moment waits in the queue, and is served', { skip }, async () => {
    const frontend = await startFrontend(tempDiscoveryUrl());
    procs.push(frontend);
    assert.equal(await lastOfBurstWhileStopped(frontend, Number(new URL(frontend.url).port), '/v1/models'), 200);
  });

  it("and so does the worker's request plane (the frontend opens one connection per stream)", { skip }, async () => {
    const worker = await startWorker(['--model', 'm', '--discovery', tempDiscoveryUrl()]);
    procs.push(worker);
    assert.equal(await lastOfBurstWhileStopped(worker, Number(new URL(worker.requestUrl).port), '/nothing-here'), 404);
  });
});
