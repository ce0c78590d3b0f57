/**
 * A llama-cpp worker checks a continuation before llama.cpp sees it: token ids that the request's
 * grammar does not allow (an end-of-sequence token inside unfinished JSON made llama.cpp abort the
 * whole process), or that are not the model's, are the caller's error: a 400 `invalid_request`
 * before any stream opens, and the worker keeps serving.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { call, openLineStream } from './helpers/http.js';
import { writeTinyLlamaGguf } from './helpers/gguf.js';
import { spawnEbb, tempDiscoveryUrl, workerReady, type EbbProcess, type WorkerHandle } from './helpers/processes.js';

const modelPath = writeTinyLlamaGguf();
const MODEL = 'tiny';
/** The tiny model's </s>. */
const EOS = 2;
const JSON_ASK = { model: MODEL, messages: [{ role: 'user', content: 'Reply in JSON' }], max_tokens: 32, temperature: 0, response_format: { type: 'json_object' } };

let w: WorkerHandle;
let p: EbbProcess | undefined;
before(async () => {
  // Started, then waited for: a worker that never gets ready is still stopped at the end.
  p = spawnEbb(['worker', '--port', '0', '--system-port', '0', '--discovery', tempDiscoveryUrl(), '--engine', 'llama-cpp', '--model-path', modelPath, '--model', MODEL, '--threads', '1', '--gpu', 'off', '--context-size', '1024', '--parallel', '1'], 'worker');
  w = await workerReady(p);
});
after(async () => {
  await p?.stop();
});

async function alive(): Promise<void> {
  const ok = await call('POST', `${w.requestUrl}/generate`, { model: MODEL, prompt: 'hello', max_tokens: 2, stream: false });
  assert.equal(ok.status, 200, 'the worker still serves');
  assert.ok(w.alive, 'the worker process is alive');
}

describe('llama-cpp: continuations checked before they reach llama.cpp', () => {
  it('an end-of-sequence token under json_object is a 400 invalid_request, streamed or not, and the worker lives', async () => {
    for (const stream of [false, true]) {
      const res = await call('POST', `${w.requestUrl}/generate`, { ...JSON_ASK, stream, continuation: { text: '', completion_tokens: 1, token_ids: [EOS] } });
      assert.equal(res.status, 400, `stream ${stream}: ${JSON.stringify(res.body)}`);
      assert.equal(res.body.error.code, 'invalid_request');
      assert.match(res.body.error.message, /continuation token 0 \(id 2\) ends the answer/);
    }
    await alive();
  });

  it('ids the grammar does not allow (text where JSON must start) are a 400, and the worker lives', async () => {
    const ids = (await call('POST', `${w.requestUrl}/generate`, { model: MODEL, prompt: 'hello', max_tokens: 3, temperature: 0, stream: true })).body as string;
    const tokenIds = ids.split('\n').filter(Boolean).map((l) => JSON.parse(l)).flatMap((p) => p.token_ids ?? []);
    assert.ok(tokenIds.length > 0);
    const res = await call('POST', `${w.requestUrl}/generate`, { ...JSON_ASK, stream: true, continuation: { text: 'x', completion_tokens: tokenIds.length, token_ids: tokenIds } });
    assert.equal(res.status, 400, JSON.stringify(res.body));
    assert.equal(res.body.error.code, 'invalid_request');
    assert.match(res.body.error.message, /does not follow response_format json_object/);
    await alive();
  });

  it('ids outside the vocabulary are a 400 (llama.cpp would abort the process), and the worker lives', async () => {
    const res = await call('POST', `${w.requestUrl}/generate`, { model: MODEL, prompt: 'hello', max_tokens: 4, stream: true, continuation: { text: 'x', completion_tokens: 1, token_ids: [999_999] } });
    assert.equal(res.status, 400);
    assert.equal(res.body.error.code, 'invalid_request');
    assert.match(res.body.error.message, /token id 999999 is not in this model's vocabulary/);
    await alive();
  });

  it('a continuation that follows the grammar goes on under it: the whole answer is the undisturbed JSON', async () => {
    const whole = await openLineStream(`${w.requestUrl}/generate`, { ...JSON_ASK, stream: true });
    const pieces = (await whole.done).map((l) => JSON.parse(l)).filter((p) => typeof p.text === 'string');
    const text = pieces.map((p) => p.text).join('');
    assert.equal(typeof JSON.parse(text), 'object');
    const first = pieces[0] as { text: string; token_ids: number[] };
    const rest = await call('POST', `${w.requestUrl}/generate`, { ...JSON_ASK, stream: false, continuation: { text: first.text, completion_tokens: first.token_ids.length, token_ids: first.token_ids } });
    assert.equal(rest.status, 200, JSON.stringify(rest.body));
    assert.equal(first.text + rest.body.text, text);
  });
});
