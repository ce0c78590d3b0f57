/**
 * `--engine openai` usage after a migration: the continuation is re-sent to the engine as part of
 * its prompt, yet the worker's usage must count the prompt once (the delivered tokens are the
 * completion's, and the frontend adds them there). A real worker in front of the engine simulator,
 * which counts a word (or an id) as a token, as a real engine counts its own tokens.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { call } from './helpers/http.js';
import { startEngineSim, type EngineSim } from './helpers/engine-sim.js';
import { startWorker, tempDiscoveryUrl, type WorkerHandle } from './helpers/processes.js';

let sim: EngineSim;
let w: WorkerHandle;
before(async () => {
  sim = await startEngineSim({ kind: 'vllm', itlMs: 1 });
  w = await startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'm1', '--engine', 'openai', '--engine-kind', 'vllm', '--engine-url', sim.url]);
});
after(async () => {
  await w?.stop();
  await sim?.close();
});

async function usageOf(body: Record<string, unknown>): Promise<{ prompt_tokens: number; completion_tokens: number }> {
  const res = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', max_tokens: 3, temperature: 0, stream: false, ...body });
  assert.equal(res.status, 200, JSON.stringify(res.body));
  return res.body.usage;
}

describe('--engine openai: usage of a continued answer', () => {
  it('counts the prompt once: a completion continued from text', async () => {
    const prompt = 'tell me about the tides';
    const whole = await usageOf({ prompt });
    const continued = await usageOf({ prompt, continuation: { text: ' tide river moon', completion_tokens: 3 } });
    assert.equal(continued.prompt_tokens, whole.prompt_tokens, 'the delivered tokens are not counted as prompt again');
    assert.equal(continued.completion_tokens, 3, "only this worker's tokens");
  });

  it('counts the prompt once: a chat continued from an assistant prefix', async () => {
    const messages = [{ role: 'user', content: 'tell me about the tides' }];
    const whole = await usageOf({ messages });
    const continued = await usageOf({ messages, continuation: { text: 'tide river', completion_tokens: 2 } });
    assert.equal(continued.prompt_tokens, whole.prompt_tokens);
  });

  it('counts the prompt once: a token-id prompt continued from ids', async () => {
    const prompt_token_ids = [5, 6, 7, 8];
    const whole = await usageOf({ prompt_token_ids });
    assert.equal(whole.prompt_tokens, 4);
    const continued = await usageOf({ prompt_token_ids, continuation: { text: ' a b', completion_tokens: 2, token_ids: [9, 10] } });
    assert.equal(continued.prompt_tokens, 4);
  });
});
