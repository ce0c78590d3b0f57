/**
 * The drain-under-load scenario shared by the file- and etcd-discovery suites: 8 client loops stream
 * completions through the frontend while one worker is drained, then resumed.
 */
import assert from 'node:assert/strict';
import { EventEmitter, once } from 'node:events';
import { call } from './http.js';
import { metricValue, type FrontendHandle, type WorkerHandle } from './processes.js';
import { streamCompletion, type StreamOutcome } from './sse.js';

/**
 * Drains `target` mid-load and asserts: every request completes with all its tokens, none is admitted
 * by the target after the drain call returned, the target reaches drained, and resume brings it back
 * into rotation. The workers must serve model `m1`.
 */
export async function drainOneUnderLoad(frontend: FrontendHandle, target: WorkerHandle): Promise<void> {
  const MAX_TOKENS = 20;
  const outcomes: StreamOutcome[] = [];
  const progress = new EventEmitter();
  let phase: 'before' | 'draining' | 'after' = 'before';
  let sent = 0;
  let stop = false;
  const loops = Array.from({ length: 8 }, async (_, i) => {
    while (!stop && sent < 2000) {
      sent++;
      outcomes.push(await streamCompletion(frontend.url, { model: 'm1', max_tokens: MAX_TOKENS, seed: i }));
      progress.emit('completed');
    }
  });
  const completedAtLeast = async (n: number) => {
    while (outcomes.length < n) await once(progress, 'completed');
  };
  await completedAtLeast(40);
  const beforeDrain = target.mark();
  const drain = await call('POST', `${target.systemUrl}/engine/drain`);
  assert.ok(drain.status === 202 || drain.status === 200);
  phase = 'draining';
  const admittedAtDrain = await metricValue(target.systemUrl, 'ebb_worker_admitted_total');
  const afterDrain = outcomes.length;
  await completedAtLeast(afterDrain + 60);
  await target.waitForEvent('state_changed', (l) => l.to === 'drained', { after: beforeDrain });
  assert.equal(await metricValue(target.systemUrl, 'ebb_worker_admitted_total'), admittedAtDrain, 'no request admitted after drain returned');

  // The frontend's worker_added from start-up must not count: only one after this resume does.
  const beforeResume = frontend.mark();
  const resumed = await call('POST', `${target.systemUrl}/engine/resume`);
  assert.equal(resumed.body.state, 'serving');
  phase = 'after';
  await frontend.waitForEvent('worker_added', (l) => l.worker_id === target.workerId, { after: beforeResume });
  const afterResume = outcomes.length;
  await completedAtLeast(afterResume + 60);
  stop = true;
  await Promise.all(loops);

  const failures = outcomes.filter((o) => o.status !== 200 || !o.done || o.tokens !== MAX_TOKENS || o.error);
  assert.deepEqual(failures, [], 'every request completes with all its tokens');
  assert.ok(await metricValue(target.systemUrl, 'ebb_worker_admitted_total') > admittedAtDrain, 'resumed worker is back in rotation');
  assert.equal(phase, 'after');
}
