/**
 * A priority request's prefill runs alone on llama.cpp (src/engine/priority-gate.ts). With flex
 * streams in the other sequences, node-llama-cpp's decode loop kept the context's lock for as long as
 * any of them had a token queued, which they always had: the priority request's first step (erasing
 * its sequence's old tokens) waited for that, while the flex streams went on generating. Now the flex
 * sequences ask for no next token from the priority request's slot to its first token: at most the
 * one each had queued is generated meanwhile, the engine counts them, and the flex streams still
 * complete byte-identical at temperature 0 (--batch-invariant).
 */
import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { frontendSeesWorkers, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess } from './helpers/processes.js';
import { call } from './helpers/http.js';
import { allStreaming, FLEX_TOKENS, flexStream, llamaCppFlexWorker, priorityRequest } from './helpers/llama-flex.js';

/** Three sequences, none kept back: two run flex, the priority request takes the third. */
const LLAMA = llamaCppFlexWorker(3);

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

describe('llama-cpp: a priority request prefills without flex decodes beside it', () => {
  it('flex streams in the other sequences generate at most their queued token between its slot and its first token, and complete byte-identical', async () => {
    const discovery = tempDiscoveryUrl();
    const worker = await startWorker(['--discovery', discovery, ...LLAMA]);
    started.push(worker);
    const frontend = await startFrontend(discovery, ['--resume-grace-ms', '0']);
    started.push(frontend);
    await frontendSeesWorkers(frontend, 1);

    // Undisturbed, with every sequence used once (the priority request's sequence then holds tokens to erase, as on a busy worker).
    const [reference0, reference1] = await Promise.all([0, 1, 2].map((i) => flexStream(frontend.url, i)));
    for (const r of [reference0!, reference1!]) assert.equal(r.usage?.completion_tokens, FLEX_TOKENS, r.error);

    const engine = async () => (await call('GET', `${worker.systemUrl}/engine/status`)).body.engine as Record<string, unknown>;
    const streams = await allStreaming(2, (i, onToken) => flexStream(frontend.url, i, onToken));
    const before = await engine();
    const priority = await priorityRequest(frontend.url);
    const afterIt = await engine();
    assert.equal(priority.usage?.completion_tokens, 4, priority.error);
    const meanwhile = (afterIt.flex_tokens_while_priority_gate_held as number) - (before.flex_tokens_while_priority_gate_held as number);
    assert.ok(meanwhile <= 2, `at most one flex token per flex sequence (the one it had queued) between the priority request's slot and its first token: ${meanwhile}`);
    assert.equal(afterIt.priority_gate_held, false, 'the gate opened at the priority request\'s first token');

    const results = await Promise.all(streams);
    for (const [i, r] of results.entries()) {
      assert.equal(r.error, undefined, `flex ${i} had no error event`);
      assert.equal(r.usage?.completion_tokens, FLEX_TOKENS, `flex ${i}: every token`);
      assert.equal(r.text, [reference0, reference1][i]!.text, `flex ${i}: byte-identical to the undisturbed run`);
    }
  });
});
