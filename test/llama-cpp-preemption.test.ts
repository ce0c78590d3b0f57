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
import { writeTinyLlamaGguf } from './helpers/gguf.js';
import { call } from './helpers/http.js';
import { bounded, frontendSeesWorkers, metricValue, spawnEbb, startFrontend, tempDiscoveryUrl, workerReady, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { streamCompletion, type StreamOutcome } from './helpers/sse.js';

const modelPath = writeTinyLlamaGguf();
const MODEL = 'tiny';
/** Enough that both flex streams still run when the priority request is answered (a few tokens). */
const FLEX_TOKENS = 600;
/** Two sequences, none kept back for priority: two flex streams fill the worker. One thread, CPU only: the machine is shared. */
const LLAMA = ['--engine', 'llama-cpp', '--model-path', modelPath, '--model', MODEL, '--threads', '1', '--gpu', 'off', '--context-size', '2048', '--parallel', '2', '--batch-invariant', '--priority-reserve-slots', '0'];

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

const question = (i: number) => `question ${i}: tell me about the tides and the moon, number ${i * 7}`;

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

  const flex = (i: number, onToken?: (n: number, seen: StreamOutcome) => void) =>
    streamCompletion(frontend.url, { model: MODEL, messages: [{ role: 'user', content: question(i) }], max_tokens: FLEX_TOKENS, temperature: 0, service_tier: 'flex', stream_options: { include_usage: true } }, undefined, onToken);
  // Undisturbed: both together, as they run below.
  const reference = await Promise.all([0, 1].map((i) => flex(i)));
  for (const r of reference) assert.equal(r.usage?.completion_tokens, FLEX_TOKENS, r.error);

  const order: string[] = [];
  let running = 0;
  let bothRunning!: () => void;
  const filled = new Promise<void>((resolve) => (bothRunning = resolve));
  const streams = [0, 1].map((i) =>
    flex(i, (n) => {
      if (n === 3 && ++running === 2) bothRunning();
    }).then((o) => (order.push(`flex${i}`), o)),
  );
  await bounded(filled, 'both flex streams to stream 3 pieces');
  const priority = await streamCompletion(frontend.url, { model: MODEL, messages: [{ role: 'user', content: 'a priority question' }], max_tokens: 4, temperature: 0, service_tier: 'priority', stream_options: { include_usage: true } });
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
