/**
 * The drain-under-load scenario shared by the file- and etcd-discovery suites: 8 client loops stream
 * completions through the frontend while one worker is drained, then resumed.
 */
import assert from 'node:assert/strict';
import { EventEmitter, once } from 'node:events';
import { call } from './http.js';
import { bounded, metricValue, type FrontendHandle, type WorkerHandle } from './processes.js';
import { streamCompletion, type StreamOutcome } from './sse.js';

type Phase = 'before' | 'draining' | 'after';

/**
 * Drains `target` mid-load and asserts: every request completes with all its tokens, none is admitted
 * by the target after the drain call returned, the target reaches drained, and resume brings it back
 * into rotation. The workers must serve model `m1`. A failed request ends it at once, and every
 * wait that runs out says which step it was, the phase, the requests so far and the target's status.
 */
export async function drainOneUnderLoad(frontend: FrontendHandle, target: WorkerHandle): Promise<void> {
  const MAX_TOKENS = 20;
  const outcomes: Array<StreamOutcome & { phase: Phase }> = [];
  const progress = new EventEmitter();
  let phase: Phase = 'before';
  let sent = 0;
  let stop = false;
  const failed = (o: StreamOutcome) => o.status !== 200 || !o.done || o.tokens !== MAX_TOKENS || o.error !== undefined;
  const loops = Array.from({ length: 8 }, async (_, i) => {
    while (!stop && sent < 2000) {
      sent++;
      const began = phase;
      // A client that throws (a refused connection) is a failed request too, not a stalled loop.
      const o = await streamCompletion(frontend.url, { model: 'm1', max_tokens: MAX_TOKENS, seed: i }).catch(
        (err: Error): StreamOutcome => ({ status: 0, tokens: 0, text: '', done: false, error: `client: ${err.message}`, workerId: null, firstTokenSeen: false, doneEvents: 0, chunkIds: [] }),
      );
      outcomes.push({ ...o, phase: began });
      progress.emit(failed(o) ? 'failed' : 'completed');
    }
  });
  const state = async () => {
    const status = await call('GET', `${target.systemUrl}/engine/status`).then((r) => JSON.stringify(r.body), (err: Error) => `unreadable (${err.message})`);
    const failures = outcomes.filter(failed);
    const first = failures.slice(0, 3).map((o) => `${o.phase}: HTTP ${o.status}, ${o.tokens} tokens, done ${o.done}, worker ${o.workerId}, ${o.error ?? ''}`);
    return `phase ${phase}, ${outcomes.length} requests ended (${failures.length} failed${first.length ? `: ${first.join(' | ')}` : ''}), ${sent} sent; target ${target.workerId} status ${status}`;
  };
  /** `p`, or a failure that names `what` and the state: at the first failed request, or at the bound. */
  const step = async <T>(what: string, p: Promise<T>): Promise<T> => {
    if (outcomes.some(failed)) throw new Error(`a request had failed before: ${what}; ${await state()}`);
    const ac = new AbortController();
    const failure = once(progress, 'failed', { signal: ac.signal }).then(() => Promise.reject(new Error('a request failed')));
    failure.catch(() => undefined);
    try {
      return await bounded(Promise.race([p, failure]), what);
    } catch (err) {
      throw new Error(`${(err as Error).message} (${what}); ${await state()}`);
    } finally {
      ac.abort();
    }
  };
  const completedAtLeast = (n: number, what: string) =>
    step(`${n} requests completed ${what}`, (async () => {
      while (outcomes.length < n) await once(progress, 'completed');
    })());

  try {
    await completedAtLeast(40, 'before the drain');
    const beforeDrain = target.mark();
    const drain = await call('POST', `${target.systemUrl}/engine/drain`);
    assert.ok(drain.status === 202 || drain.status === 200, `drain answered ${drain.status}: ${JSON.stringify(drain.body)}`);
    phase = 'draining';
    const admittedAtDrain = await metricValue(target.systemUrl, 'ebb_worker_admitted_total');
    await completedAtLeast(outcomes.length + 60, 'while the target drains');
    await step('the target to reach drained', target.waitForEvent('state_changed', (l) => l.to === 'drained', { after: beforeDrain }));
    assert.equal(await metricValue(target.systemUrl, 'ebb_worker_admitted_total'), admittedAtDrain, 'no request admitted after drain returned');

    // The frontend's worker_added from start-up must not count: only one after this resume does.
    const beforeResume = frontend.mark();
    const resumed = await call('POST', `${target.systemUrl}/engine/resume`);
    assert.equal(resumed.body.state, 'serving', JSON.stringify(resumed.body));
    phase = 'after';
    await step('the frontend to add the resumed target', frontend.waitForEvent('worker_added', (l) => l.worker_id === target.workerId, { after: beforeResume }));
    await completedAtLeast(outcomes.length + 60, 'after the resume');
    stop = true;
    await step('the client loops to end', Promise.all(loops));

    assert.deepEqual(outcomes.filter(failed), [], 'every request completes with all its tokens');
    assert.ok(await metricValue(target.systemUrl, 'ebb_worker_admitted_total') > admittedAtDrain, 'resumed worker is back in rotation');
  } finally {
    stop = true;
  }
}
