import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { call } from './helpers/http.js';
import { bounded, spawnEbb, type EbbProcess } from './helpers/processes.js';

const started: EbbProcess[] = [];
after(() => {
  // `ebb up` is SIGKILLed by the test: its children are ours to stop if they outlived it.
  for (const p of started) if (p.alive) p.signal('SIGKILL');
  for (const pid of orphans) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      /* gone, as it should be */
    }
  }
});
const orphans: number[] = [];

describe('ebb up dies without stopping its workers', () => {
  it('a drained worker exits like a serving one (its stdout reader is gone)', async () => {
    const p = spawnEbb(['up', '--port', '0', '--workers', '2'], 'ebb up');
    started.push(p);
    const first = await p.waitForEvent('worker_ready');
    const workers = [first, await p.waitForEvent('worker_ready', () => true, { after: p.logs.indexOf(first) + 1 })];
    const frontend = await p.waitForEvent('frontend_ready');
    orphans.push(...workers.map((w) => w.pid as number), frontend.pid as number);
    const drained = await call('POST', `${String(workers[0]?.system_url)}/engine/drain`, {});
    assert.equal(drained.body.state, 'drained');
    // The children's stderr is ebb up's, so the test's end of that pipe closes only once every
    // child has exited: that is the event that says none was left behind.
    const closed = once(p.proc, 'close');
    p.signal('SIGKILL');
    await bounded(closed, 'every child of the killed ebb up exited (their stderr closed)', 20_000);
  });
});
