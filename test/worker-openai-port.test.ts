/**
 * `ebb worker --openai-port`: the OpenAI API for this worker alone, where an InferencePool's endpoint
 * picker forwards a client's request. Its requests go through the worker's own admission: counted in
 * flight, waited for by a drain, refused (retryable) once the worker drains.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { call } from './helpers/http.js';
import { startWorker, tempDiscoveryUrl, type WorkerHandle } from './helpers/processes.js';

const KEY = 'picker-key';
const TOKENS = 100;

describe('ebb worker --openai-port', () => {
  let w: WorkerHandle;
  let base: string;
  before(async () => {
    const keys = join(mkdtempSync(join(tmpdir(), 'ebb-openai-port-')), 'api-keys');
    writeFileSync(keys, `${KEY}\n`, { mode: 0o600 });
    // 100 tokens 20 ms apart: the stream is still running when the drain and the late request come.
    w = await startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'm1', '--openai-port', '0', '--api-key-file', keys, '--mocker-itl-ms', '20', '--mocker-ttft-ms', '0']);
    base = w.openaiUrl ?? assert.fail('worker_ready names no openai_url');
  });
  after(async () => {
    await w.terminate();
  });

  it('logs the port it bound (0 asked); its /v1/ routes need one of the --api-key-file keys, its probes none', async () => {
    assert.match(base, /^http:\/\/127\.0\.0\.1:\d+$/);
    assert.notEqual(new URL(base).port, '0');
    assert.match(String(w.logs.find((l) => l.event === 'worker_ready')?.msg), new RegExp(`OpenAI API ${base}/v1`));
    assert.equal((await call('GET', `${base}/v1/models`)).status, 401, 'no key');
    assert.equal((await call('GET', `${base}/v1/models`, undefined, { authorization: 'Bearer wrong' })).status, 401, 'a wrong key (OpenAI\'s 401 invalid_api_key)');
    const models = await call('GET', `${base}/v1/models`, undefined, { authorization: `Bearer ${KEY}` });
    assert.deepEqual(models.body.data.map((m: { id: string; status: string }) => [m.id, m.status]), [['m1', 'available']]);
    assert.equal((await call('GET', `${base}/health`)).status, 200, '/health: ready while the worker serves');
  });

  it('streams a chat completion through the openai SDK; a drain meanwhile waits for it, and a new request is a retryable 503 until resume', async () => {
    const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY, maxRetries: 0 });
    const stream = await client.chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'tell me about tides' }], max_tokens: TOKENS, stream: true });
    const chunks = stream[Symbol.asyncIterator]();
    let text = '';
    let contentChunks = 0;
    while (contentChunks === 0) {
      const next = await chunks.next();
      assert.ok(!next.done, 'the stream ended before its first token');
      const content = next.value.choices[0]?.delta.content ?? '';
      if (content !== '') contentChunks++;
      text += content;
    }

    const drain = await call('POST', `${w.systemUrl}/engine/drain`, { reason: 'picker test' });
    assert.equal(drain.status, 202, `draining, not drained: the OpenAI port's stream is in flight on the worker (${JSON.stringify(drain.body)})`);
    assert.equal(drain.body.state, 'draining');
    assert.equal(drain.body.inflight_requests, 1, "the stream is counted by the worker's admission");

    // Out of the port's routing view the moment the drain unregistered, before any request learnt it.
    assert.equal((await call('GET', `${base}/health`)).status, 503, '/health on the OpenAI port fails once the drain began');
    // The picker has dropped the pod by now (readiness fails on drain); a request that still comes is refused, retryable.
    const late = await client.chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'late' }], max_tokens: 2 }).then(
      () => assert.fail('a request during the drain was served'),
      (err: unknown) => err,
    );
    assert.ok(late instanceof OpenAI.APIError, String(late));
    assert.equal(late.status, 503);
    assert.equal(late.code, 'no_serving_worker');
    assert.equal((late.error as { retryable?: boolean }).retryable, true);
    const mid = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(mid.body.state, 'draining', 'not drained while the stream runs');

    let finish: string | null | undefined;
    for (let next = await chunks.next(); !next.done; next = await chunks.next()) {
      const content = next.value.choices[0]?.delta.content ?? '';
      if (content !== '') contentChunks++;
      text += content;
      finish = next.value.choices[0]?.finish_reason ?? finish;
    }
    assert.equal(contentChunks, TOKENS, 'every token delivered through the drain');
    assert.equal(finish, 'length');
    assert.ok(text.length > 0);
    const drained = await w.waitForEvent('state_changed', (l) => l.to === 'drained');
    assert.equal(drained.inflight, 0);

    const resumed = await call('POST', `${w.systemUrl}/engine/resume`);
    assert.equal(resumed.body.state, 'serving');
    const after = await client.chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'again' }], max_tokens: 2 });
    assert.equal(after.usage?.completion_tokens, 2, 'served again once resumed');
  });
});
