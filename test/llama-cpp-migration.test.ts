/**
 * Stream migration between two real llama-cpp workers behind a real frontend: 12 answers at
 * temperature 0 are handed off mid-stream from one worker to the other, and each must equal the
 * same answer given undisturbed (the README's promise for continuations with token ids). The
 * workers run --batch-invariant: with continuous batching, llama.cpp's arithmetic for one answer
 * depends on what shares its decodes, and this test saw 6 of 12 answers part from their
 * undisturbed runs hundreds of tokens after the seam (see llama-cpp.ts).
 */
import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { call } from './helpers/http.js';
import { writeTinyLlamaGguf } from './helpers/gguf.js';
import { spawnEbb, startFrontend, tempDiscoveryUrl, workerReady, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { streamCompletion, type StreamOutcome } from './helpers/sse.js';

const modelPath = writeTinyLlamaGguf();
const MODEL = 'tiny';
const ANSWERS = 12;
/** Long enough that every stream is still running when the second worker is back in rotation. */
const TOKENS = 500;
/** One thread each, CPU only: the machine is shared. */
const LLAMA = ['--engine', 'llama-cpp', '--model-path', modelPath, '--model', MODEL, '--threads', '1', '--gpu', 'off', '--context-size', '2048', '--parallel', String(ANSWERS), '--batch-invariant'];

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

/** Started, then waited for: a worker that never gets ready is still stopped at the end. */
async function llamaWorker(discovery: string): Promise<WorkerHandle> {
  const p = spawnEbb(['worker', '--port', '0', '--system-port', '0', '--discovery', discovery, ...LLAMA], 'worker');
  started.push(p);
  return workerReady(p);
}

/** Drain answers 202 while requests run, 200 when the worker is drained at once; resume 200. */
const isOk = (r: { status: number }) => r.status === 200 || r.status === 202;

const question = (i: number) => `question ${i}: tell me about the tides and the moon, number ${i * 7}`;

function ask(frontend: FrontendHandle, i: number, onToken?: (n: number) => void): Promise<StreamOutcome> {
  return streamCompletion(
    frontend.url,
    { model: MODEL, messages: [{ role: 'user', content: question(i) }], max_tokens: TOKENS, temperature: 0, stream_options: { include_usage: true } },
    undefined,
    onToken,
  );
}

describe('llama-cpp migration at temperature 0 (--batch-invariant)', () => {
  it('12 answers handed off mid-stream to another worker equal their undisturbed runs', async () => {
    const discovery = tempDiscoveryUrl();
    const a = await llamaWorker(discovery);
    const b = await llamaWorker(discovery);
    const frontend = await startFrontend(discovery);
    started.push(frontend);
    const waitRouted = (w: WorkerHandle, cursor: { after: number }) =>
      frontend.waitForLog(
        (l) => (l.event === 'discovery_reset' && (l.workers as string[]).includes(w.workerId)) || (l.event === 'worker_added' && l.worker_id === w.workerId),
        `the frontend routes to ${w.workerId}`,
        cursor,
      );
    await Promise.all([waitRouted(a, { after: 0 }), waitRouted(b, { after: 0 })]);

    // Undisturbed: the same requests on B alone (A drained, out of rotation).
    const left = frontend.mark();
    assert.ok(isOk(await call('POST', `${a.systemUrl}/engine/drain`)));
    await frontend.waitForLog((l) => l.event === 'worker_removed' && l.worker_id === a.workerId, 'A left the routing view', { after: left });
    const undisturbed = await Promise.all(Array.from({ length: ANSWERS }, (_, i) => ask(frontend, i)));
    for (const r of undisturbed) assert.equal(r.usage?.completion_tokens, TOKENS, r.error);

    // Migrated: all 12 start on A (B drained); once each has streamed, B comes back and A hands them all off.
    const back = frontend.mark();
    assert.ok(isOk(await call('POST', `${a.systemUrl}/engine/resume`)));
    await waitRouted(a, { after: back });
    const gone = frontend.mark();
    assert.ok(isOk(await call('POST', `${b.systemUrl}/engine/drain`)));
    await frontend.waitForLog((l) => l.event === 'worker_removed' && l.worker_id === b.workerId, 'B left the routing view', { after: gone });
    let progressed!: () => void;
    const allProgressed = new Promise<void>((resolve) => (progressed = resolve));
    let ready = 0;
    const migrated = Array.from({ length: ANSWERS }, (_, i) =>
      ask(frontend, i, (n) => {
        if (n === 10 && ++ready === ANSWERS) progressed();
      }),
    );
    await allProgressed;
    const rejoined = frontend.mark();
    assert.ok(isOk(await call('POST', `${b.systemUrl}/engine/resume`)));
    await waitRouted(b, { after: rejoined });
    assert.ok(isOk(await call('POST', `${a.systemUrl}/engine/drain`, { deadline_ms: 0 })));
    const results = await Promise.all(migrated);

    const moved = await frontend.waitForCount((l) => l.event === 'stream_migrated' && l.from_worker === a.workerId && l.to_worker === b.workerId, ANSWERS, 'stream_migrated from A to B');
    assert.equal(moved.length, ANSWERS, 'every answer moved from A to B');
    const diverged: number[] = [];
    for (const [i, r] of results.entries()) {
      assert.equal(r.error, undefined, `answer ${i}: ${r.error}`);
      assert.equal(r.doneEvents, 1);
      assert.equal(r.usage?.completion_tokens, TOKENS, `answer ${i}: usage counts the whole completion`);
      assert.equal(r.usage?.prompt_tokens, undisturbed[i]!.usage?.prompt_tokens, `answer ${i}: the prompt counted once`);
      if (r.text !== undisturbed[i]!.text) diverged.push(i);
    }
    assert.deepEqual(diverged, [], 'answers whose migrated text differs from the undisturbed run');
  });
});
