import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as delay } from 'node:timers/promises';
import { call } from './helpers/http.js';
import { bounded, metricValue, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { streamCompletion, type StreamOutcome } from './helpers/sse.js';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

async function fleet(workers: number, workerArgs: string[], frontendArgs: string[] = []): Promise<{ frontend: FrontendHandle; workers: WorkerHandle[] }> {
  const discovery = tempDiscoveryUrl();
  const ws: WorkerHandle[] = [];
  for (let i = 0; i < workers; i++) {
    const w = await startWorker(['--discovery', discovery, '--model', 'm1', ...workerArgs]);
    started.push(w);
    ws.push(w);
  }
  const frontend = await startFrontend(discovery, frontendArgs);
  started.push(frontend);
  return { frontend, workers: ws };
}

/** The texts of the same requests on an undisturbed fleet (no delay: the mocker's text depends only on prompt and seed). */
let reference: FrontendHandle;
before(async () => {
  ({ frontend: reference } = await fleet(1, ['--mocker-itl-ms', '0', '--mocker-ttft-ms', '0']));
});

/** Each (count, tokens) once: several cases compare against the same undisturbed texts. */
const references = new Map<string, Promise<string[]>>();
function referenceTexts(count: number, maxTokens: number): Promise<string[]> {
  const key = `${count}x${maxTokens}`;
  let texts = references.get(key);
  if (texts === undefined) references.set(key, (texts = computeReferenceTexts(count, maxTokens)));
  return texts;
}

async function computeReferenceTexts(count: number, maxTokens: number): Promise<string[]> {
  const out: string[] = [];
  for (let seed = 0; seed < count; seed++) {
    const r = await streamCompletion(reference.url, { model: 'm1', max_tokens: maxTokens, seed });
    assert.equal(r.tokens, maxTokens, r.error);
    out.push(r.text);
  }
  return out;
}

/**
 * Starts `count` streams (seed i) and resolves `progressed` once every one has streamed `atLeast`
 * tokens: the moment to break a worker under them. `onProgressed` runs at that very token, with the
 * worker serving each stream: a worker broken there cannot have finished a stream meanwhile (as it
 * could while its status is read on a loaded machine). A stream that ends before then fails the wait.
 */
function startStreams(frontend: FrontendHandle, count: number, maxTokens: number, atLeast: number, onProgressed: (servedBy: Array<string | null>) => void = () => undefined) {
  let ready = 0;
  let progressed!: () => void;
  let ended!: (err: Error) => void;
  const allProgressed = new Promise<void>((resolve, reject) => ((progressed = resolve), (ended = reject)));
  const servedBy: Array<string | null> = [];
  const streams = Array.from({ length: count }, (_, seed) =>
    streamCompletion(frontend.url, { model: 'm1', max_tokens: maxTokens, seed, stream_options: { include_usage: true } }, undefined, (n, seen) => {
      if (n !== atLeast) return;
      servedBy[seed] = seen.workerId;
      if (++ready !== count) return;
      onProgressed(servedBy);
      progressed();
    }).then((o) => {
      if (o.tokens < atLeast) ended(new Error(`stream ${seed} ended at ${o.tokens} tokens, before ${atLeast}: HTTP ${o.status} ${o.error ?? ''}`));
      return o;
    }),
  );
  const waited = bounded(allProgressed, `all ${count} streams to reach ${atLeast} tokens`).catch((err: Error) => {
    throw new Error(`${err.message} (${ready} did)`);
  });
  return { streams, allProgressed: waited };
}

/** The worker serving most of `servedBy`, and how many it serves. */
function mostServing(workers: WorkerHandle[], servedBy: Array<string | null>): { worker: WorkerHandle; inflight: number } {
  const counts = workers.map((w) => servedBy.filter((id) => id === w.workerId).length);
  const i = counts.indexOf(Math.max(...counts));
  return { worker: workers[i]!, inflight: counts[i]! };
}

async function busiest(workers: WorkerHandle[]): Promise<{ worker: WorkerHandle; inflight: number }> {
  const counts = await Promise.all(workers.map(async (w) => (await call('GET', `${w.systemUrl}/engine/status`)).body.inflight_requests as number));
  const i = counts.indexOf(Math.max(...counts));
  return { worker: workers[i]!, inflight: counts[i]! };
}

/** Every stream completed once, as one stream, with the undisturbed text and a usage for the whole completion. */
function assertUndisturbed(results: StreamOutcome[], expected: string[], maxTokens: number): void {
  for (const [i, r] of results.entries()) {
    assert.equal(r.status, 200, `stream ${i}: ${r.error}`);
    assert.equal(r.error, undefined, `stream ${i} had an error event`);
    assert.equal(r.doneEvents, 1, `stream ${i}: one [DONE]`);
    assert.equal(r.text, expected[i], `stream ${i}: text equals the undisturbed run`);
    assert.equal(r.chunkIds.length, 1, `stream ${i}: one id across workers`);
    assert.equal(r.usage?.completion_tokens, maxTokens, `stream ${i}: usage counts the whole completion`);
  }
}

describe('migration: a worker fails mid-stream', () => {
  // Few tokens, slowly: each token costs CPU in three processes, and the streams only have to outlast
  // the moment the worker is broken (10 tokens in, 1.3 s before they could finish).
  const STREAMS = 16;
  const TOKENS = 100;
  const ITL = ['--mocker-itl-ms', '15', '--mocker-batch-slots', '16'];

  it('SIGKILL of the busiest of 3 workers: all 16 streams complete with the undisturbed text', async () => {
    const expected = await referenceTexts(STREAMS, TOKENS);
    const { frontend, workers } = await fleet(3, ITL);
    let broken!: { worker: WorkerHandle; inflight: number };
    const { streams, allProgressed } = startStreams(frontend, STREAMS, TOKENS, 10, (servedBy) => {
      broken = mostServing(workers, servedBy);
      broken.worker.signal('SIGKILL');
    });
    await allProgressed;
    const { worker: victim, inflight } = broken;
    assert.ok(inflight > 0);
    const results = await Promise.all(streams);
    assertUndisturbed(results, expected, TOKENS);
    const moved = await frontend.waitForCount((l) => l.event === 'stream_migrated' && l.from_worker === victim.workerId, inflight, `stream_migrated from ${victim.workerId}`);
    assert.equal(moved.length, inflight, 'one migration log line per stream the victim was serving');
    for (const l of moved) assert.ok((l.tokens_delivered as number) >= 10 && l.to_worker !== victim.workerId);
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_migrations_total', 'reason="worker_failed"'), inflight);
  });

  it('SIGSTOP (hung) of the busiest of 3 workers: all 16 streams complete with the undisturbed text', async () => {
    const expected = await referenceTexts(STREAMS, TOKENS);
    // Long past any stall of a healthy worker on a loaded machine: only the stopped one is unresponsive.
    const { frontend, workers } = await fleet(3, ITL, ['--stream-idle-timeout-ms', '2000']);
    let broken!: { worker: WorkerHandle; inflight: number };
    const { streams, allProgressed } = startStreams(frontend, STREAMS, TOKENS, 10, (servedBy) => {
      broken = mostServing(workers, servedBy);
      broken.worker.signal('SIGSTOP');
    });
    await allProgressed;
    const { worker: victim, inflight } = broken;
    try {
      const results = await Promise.all(streams);
      assertUndisturbed(results, expected, TOKENS);
      assert.equal(await metricValue(frontend.url, 'ebb_frontend_migrations_total', 'reason="worker_unresponsive"'), inflight);
    } finally {
      victim.signal('SIGKILL');
    }
  });

  it('with no other worker, a SIGKILL mid-stream ends the stream with an explicit error event', async () => {
    const { frontend, workers } = await fleet(1, ['--mocker-itl-ms', '15']);
    const { streams, allProgressed } = startStreams(frontend, 1, TOKENS, 5);
    await allProgressed;
    workers[0]!.signal('SIGKILL');
    const [r] = await Promise.all(streams);
    assert.equal(r!.done, false, 'no [DONE] for a stream that did not complete');
    assert.equal(r!.errorCode, 'worker_failed_mid_stream');
    assert.match(r!.error ?? '', /no other worker continued it/);
    assert.ok(r!.tokens >= 5 && r!.tokens < TOKENS);
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_migration_failures_total', 'reason="no_worker"'), 1);
  });
});

describe('migration: hand-off at a drain deadline', () => {
  const STREAMS = 6;
  const TOKENS = 200;
  const ITL = ['--mocker-itl-ms', '40', '--mocker-batch-slots', '16'];

  it('POST /engine/drain {"deadline_ms": 500}: drained while the streams still run elsewhere, texts unchanged', async () => {
    const expected = await referenceTexts(STREAMS, TOKENS);
    const { frontend, workers } = await fleet(3, ITL);
    const { streams, allProgressed } = startStreams(frontend, STREAMS, TOKENS, 3);
    await allProgressed;
    const { worker: target, inflight } = await busiest(workers);
    assert.ok(inflight > 0);
    const mark = target.mark();
    const drain = await call('POST', `${target.systemUrl}/engine/drain`, { deadline_ms: 500 });
    assert.equal(drain.status, 202);
    assert.equal(typeof drain.body.drain_deadline, 'string');
    const done = Promise.all(streams);
    let clientsFinished = false;
    void done.then(() => (clientsFinished = true));
    await target.waitForEvent('state_changed', (l) => l.to === 'drained', { after: mark });
    assert.equal(clientsFinished, false, 'drained before the 8 s streams could have finished: they were handed off');
    const status = (await call('GET', `${target.systemUrl}/engine/status`)).body;
    assert.equal(status.state, 'drained');
    assert.equal(status.handed_off, inflight);
    assert.equal(status.inflight_requests, 0);
    assertUndisturbed(await done, expected, TOKENS);
    assert.equal(await metricValue(target.systemUrl, 'ebb_worker_handoffs_total'), inflight);
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_migrations_total', 'reason="handoff"'), inflight);
  });

  it('hands off non-streaming requests too: the client gets one whole answer', async () => {
    const tokens = 100;
    const expected = await referenceTexts(2, tokens);
    const { frontend, workers } = await fleet(2, ITL);
    const answers = [0, 1].map((seed) =>
      call('POST', `${frontend.url}/v1/chat/completions`, { model: 'm1', max_tokens: tokens, seed, messages: [{ role: 'user', content: 'tell me about tides' }] }),
    );
    // A non-streaming client sees nothing until the end: wait until the workers have admitted both.
    for (let i = 0; (await Promise.all(workers.map((w) => call('GET', `${w.systemUrl}/engine/status`)))).some((s) => s.body.inflight_requests !== 1); i++) {
      assert.ok(i < 500, 'both requests admitted, one per worker');
      await delay(20);
    }
    const drain = await call('POST', `${workers[0]!.systemUrl}/engine/drain`, { deadline_ms: 300 });
    assert.equal(drain.status, 202);
    for (const [i, res] of (await Promise.all(answers)).entries()) {
      assert.equal(res.status, 200, JSON.stringify(res.body));
      assert.equal(res.body.choices[0].message.content, expected[i]);
      assert.equal(res.body.usage.completion_tokens, tokens);
    }
    assert.equal((await call('GET', `${workers[0]!.systemUrl}/engine/status`)).body.handed_off, 1);
  });

  it('SIGTERM with --drain-timeout-ms 1000: streams handed off, exit 0, texts unchanged', async () => {
    const expected = await referenceTexts(STREAMS, TOKENS);
    const { frontend, workers } = await fleet(3, [...ITL, '--shutdown-grace-ms', '0', '--drain-timeout-ms', '1000']);
    const { streams, allProgressed } = startStreams(frontend, STREAMS, TOKENS, 3);
    await allProgressed;
    const { worker: target, inflight } = await busiest(workers);
    target.signal('SIGTERM');
    assert.equal(await target.exitCode(), 0);
    const complete = await target.waitForEvent('shutdown_complete');
    const stages = Object.fromEntries((complete.stages as Array<{ stage: string; outcome: string }>).map((s) => [s.stage, s.outcome]));
    assert.equal(stages.handoff, 'completed');
    assert.equal(stages.cut_inflight, 'skipped');
    assertUndisturbed(await Promise.all(streams), expected, TOKENS);
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_migrations_total', 'reason="handoff"'), inflight);
  });
});
