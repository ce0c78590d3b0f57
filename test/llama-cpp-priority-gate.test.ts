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
import { writeTinyLlamaGguf } from './helpers/gguf.js';
import { bounded, frontendSeesWorkers, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess } from './helpers/processes.js';
import { call } from './helpers/http.js';
import { streamCompletion } from './helpers/sse.js';

const MODEL = 'tiny';
/** Long enough that both flex streams still run when the priority request is answered. */
const FLEX_TOKENS = 600;
/** Three sequences, none kept back: two run flex, the priority request takes the third. One thread, CPU only: the machine is shared. */
const LLAMA = ['--engine', 'llama-cpp', '--model-path', writeTinyLlamaGguf(), '--model', MODEL, '--threads', '1', '--gpu', 'off', '--context-size', '2048', '--parallel', '3', '--batch-invariant', '--priority-reserve-slots', '0'];

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

const question = (i: number) => `question ${i}: tell me about the tides and the moon, number ${i * 7}`;

describe('llama-cpp: a priority request prefills without flex decodes beside it', () => {
  it('flex streams in the other sequences generate at most their queued token between its slot and its first token, and complete byte-identical', async () => {
    const discovery = tempDiscoveryUrl();
    const worker = await startWorker(['--discovery', discovery, ...LLAMA]);
    started.push(worker);
    const frontend = await startFrontend(discovery, ['--resume-grace-ms', '0']);
    started.push(frontend);
    await frontendSeesWorkers(frontend, 1);

    const flex = (i: number, onToken?: (n: number) => void) =>
      streamCompletion(frontend.url, { model: MODEL, messages: [{ role: 'user', content: question(i) }], max_tokens: FLEX_TOKENS, temperature: 0, service_tier: 'flex', stream_options: { include_usage: true } }, undefined, onToken);
    // Undisturbed, with every sequence used once (the priority request's sequence then holds tokens to erase, as on a busy worker).
    const [reference0, reference1] = await Promise.all([flex(0), flex(1), flex(2)]);
    for (const r of [reference0!, reference1!]) assert.equal(r.usage?.completion_tokens, FLEX_TOKENS, r.error);

    const engine = async () => (await call('GET', `${worker.systemUrl}/engine/status`)).body.engine as Record<string, unknown>;
    let running = 0;
    let bothRunning!: () => void;
    const filled = new Promise<void>((resolve) => (bothRunning = resolve));
    const streams = [0, 1].map((i) =>
      flex(i, (n) => {
        if (n === 3 && ++running === 2) bothRunning();
      }),
    );
    await bounded(filled, 'both flex streams to stream 3 pieces');
    const before = await engine();
    const priority = await streamCompletion(frontend.url, { model: MODEL, messages: [{ role: 'user', content: 'a priority question' }], max_tokens: 4, temperature: 0, service_tier: 'priority', stream_options: { include_usage: true } });
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
