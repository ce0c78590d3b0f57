/**
 * --api-key-file: the public API asks clients for a key (the OpenAI SDKs send theirs as
 * Authorization: Bearer); probes and scrapers stay keyless. Without the flag the API is open.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle } from './helpers/processes.js';

const started: EbbProcess[] = [];
let frontend: FrontendHandle;

before(async () => {
  const keys = join(mkdtempSync(join(tmpdir(), 'ebb-keys-')), 'api-keys');
  writeFileSync(keys, 'team-a:sk-ebb-a\nteam-b:sk-ebb-b\n', { mode: 0o600 });
  const discovery = tempDiscoveryUrl();
  started.push(await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '0']));
  frontend = await startFrontend(discovery, ['--api-key-file', keys]);
  started.push(frontend);
  await frontend.waitForLog((l) => l.event === 'worker_added' || (l.event === 'discovery_reset' && (l.workers as string[]).length > 0), 'the worker');
});
after(async () => {
  await Promise.all(started.map((p) => p.terminate()));
});

describe('--api-key-file', () => {
  it('a request without a key is 401 in OpenAI\'s error shape, a wrong key 401 invalid_api_key (the SDK\'s AuthenticationError), a listed key served', async () => {
    const body = JSON.stringify({ model: 'm1', prompt: 'x', max_tokens: 2 });
    const post = (headers: Record<string, string>) => fetch(`${frontend.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
    const none = await post({});
    assert.equal(none.status, 401);
    const error = ((await none.json()) as { error: { code: string; message: string } }).error;
    assert.equal(error.code, 'unauthorized');
    assert.match(error.message, /Authorization: Bearer/);
    // A wrong key as OpenAI answers it: 401 invalid_api_key, which the SDK raises as AuthenticationError.
    const wrong = await post({ authorization: 'Bearer sk-nope' });
    assert.equal(wrong.status, 401);
    assert.deepEqual(((await wrong.json()) as { error: unknown }).error, { message: "Incorrect API key provided: it is not one of this server's keys (--api-key-file)", type: 'invalid_request_error', param: null, code: 'invalid_api_key' });
    const stranger = new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'sk-nope', maxRetries: 0 });
    await assert.rejects(stranger.chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'x' }], max_tokens: 2 }), (err: unknown) => {
      assert.ok(err instanceof OpenAI.AuthenticationError, `an AuthenticationError, not ${(err as Error).constructor.name}`);
      assert.equal(err.code, 'invalid_api_key');
      return true;
    });
    const client = new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'sk-ebb-b', maxRetries: 0 });
    const done = await client.completions.create({ model: 'm1', prompt: 'x', max_tokens: 2 });
    assert.equal(done.choices.length, 1);
    assert.equal((await client.models.list()).data[0]?.id, 'm1');
    // Every /v1/ route, embeddings too.
    const embedNone = await fetch(`${frontend.url}/v1/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'm1', input: 'x' }) });
    assert.equal(embedNone.status, 401);
    await embedNone.arrayBuffer();
    assert.equal((await client.embeddings.create({ model: 'm1', input: 'x' })).data.length, 1);
  });

  it('/live, /health and /metrics need no key', async () => {
    for (const path of ['/live', '/health', '/metrics']) {
      const res = await fetch(`${frontend.url}${path}`);
      await res.arrayBuffer();
      assert.equal(res.status, 200, path);
    }
  });
});
