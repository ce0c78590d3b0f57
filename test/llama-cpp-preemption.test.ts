/**
 * Priority preemption on a real llama.cpp (issue 48 item 3, "mocker and llama-cpp"): a worker whose
 * two sequences run flex streams at temperature 0 pauses one for a priority request (its KV state
 * saved with the hand-off); the priority request is answered while the flex streams still run, and
 * the paused stream, continued on the same worker, equals its undisturbed run byte for byte. The
 * worker runs --batch-invariant: llama.cpp's arithmetic for one answer otherwise depends on what
 * shares its decodes (llama-cpp-migration.test.ts). The same with --preemption-spare-sequence: the
 * priority request starts on the spare sequence while the paused one writes its state, which its
 * continuation still loads.
 */
import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { call } from './helpers/http.js';
import { allStreaming, FLEX_TOKENS, flexStream, llamaCppFlexWorker, priorityRequest } from './helpers/llama-flex.js';
import { frontendSeesWorkers, metricValue, spawnEbb, startFrontend, tempDiscoveryUrl, workerReady, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';

/** Two sequences, none kept back for priority: two flex streams fill the worker. */
const LLAMA = llamaCppFlexWorker(2);

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

describe('llama-cpp priority preemption at temperature 0 (--batch-invariant)', () => {
  it('a worker whose sequences all run flex streams answers a priority request before they end; the paused one completes byte-identical', () => preemptsWithoutLoss(false));
  it('the same with --preemption-spare-sequence: the priority request takes the spare sequence, the paused stream still continues from its KV state, byte-identical', () => preemptsWithoutLoss(true));
});

async function preemptsWithoutLoss(spare: boolean): Promise<void> {
  const discovery = tempDiscoveryUrl();
  const p = spawnEbb(['worker', '--port', '0', '--system-port', '0', '--discovery', discovery, ...LLAMA, ...(spare ? ['--preemption-spare-sequence'] : [])], 'worker');
  started.push(p);
  const worker: WorkerHandle = await workerReady(p);
  const frontend: FrontendHandle = await startFrontend(discovery, ['--resume-grace-ms', '0']);
  started.push(frontend);
  await frontendSeesWorkers(frontend, 1);

  // Undisturbed: both together, as they run below.
  const reference = await Promise.all([0, 1].map((i) => flexStream(frontend.url, i)));
  for (const r of reference) assert.equal(r.usage?.completion_tokens, FLEX_TOKENS, r.error);

  const order: string[] = [];
  const streams = await allStreaming(2, (i, onToken) => flexStream(frontend.url, i, onToken).then((o) => (order.push(`flex${i}`), o)));
  const priority = await priorityRequest(frontend.url);
  order.push('priority');
  assert.equal(priority.usage?.completion_tokens, 4, priority.error);
  const results = await Promise.all(streams);

  assert.deepEqual(order.slice(0, 1), ['priority'], `the priority request was answered before either flex stream ended (${order.join(', ')})`);
  assert.equal(await metricValue(worker.systemUrl, 'ebb_worker_preemptions_total'), 1, 'the worker paused one flex stream for it');
  assert.equal(await metricValue(frontend.url, 'ebb_frontend_migrations_total', 'reason="preempted"'), 1, 'the frontend continued it');
  assert.equal(await metricValue(worker.systemUrl, 'ebb_kv_state_pulls_total', 'outcome="pulled"'), 1, 'its continuation took the KV state it was paused with (no prompt evaluated again)');
  const paused = p.logs.find((l) => l.event === 'preempted');
  assert.ok(paused !== undefined && (paused.tokens as number) > 0, 'the worker logged the pause, after the stream had tokens');
  for (const [i, r] of results.entries()) {
    assert.equal(r.status, 200, `flex ${i}: ${r.error}`);
    assert.equal(r.error, undefined, `flex ${i} had no error event`);
    assert.equal(r.doneEvents, 1, `flex ${i}: one [DONE]`);
    assert.equal(r.chunkIds.length, 1, `flex ${i}: one id, paused or not`);
    assert.equal(r.usage?.completion_tokens, FLEX_TOKENS, `flex ${i}: usage counts the whole completion`);
    assert.equal(r.text, reference[i]!.text, `flex ${i}: byte-identical to the undisturbed run`);
  }
  const engine = (await call('GET', `${worker.systemUrl}/engine/status`)).body.engine as Record<string, unknown>;
  assert.equal(engine.spare_sequence, spare ? 'free' : 'off');
  assert.equal(engine.spare_sequence_lent_total, spare ? 1 : 0, spare ? 'the paused stream gave its slot back before its sequence' : 'no spare to lend');
}
