/**
 * POST /tokenize on a mocker worker's request plane: the mocker's word ids of the prompt as the
 * request plane builds it (chat messages joined), behind the request-plane token like every route,
 * bounded in concurrency and refused once admission is closed (draining).
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { mockerTokenIds } from '../src/protocol/mocker-tokenizer.js';
import { call, rawConnect } from './helpers/http.js';
import { MAX_TOKENIZING } from '../src/worker/request-plane.js';
import { bounded, startWorker, tempDiscoveryUrl, type WorkerHandle } from './helpers/processes.js';

describe('POST /tokenize (mocker)', () => {
  let w: WorkerHandle;
  const auth = { authorization: 'Bearer tok-123' };
  before(async () => {
    const file = join(mkdtempSync(join(tmpdir(), 'ebb-tok-')), 'token');
    writeFileSync(file, 'tok-123\n', { mode: 0o600 });
    w = await startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'm1', '--request-token-file', file]);
  });
  after(async () => {
    await w?.stop();
  });

  it('answers the mocker\'s word ids of the prompt of chat messages as joined for the engine, and of a continuation', async () => {
    const plain = await call('POST', `${w.requestUrl}/tokenize`, { model: 'm1', prompt: 'the tide  comes\nin' }, auth);
    assert.equal(plain.status, 200);
    assert.deepEqual(plain.body, { token_ids: mockerTokenIds('the tide comes in') });
    const messages = [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hello' }];
    const chat = await call('POST', `${w.requestUrl}/tokenize`, { model: 'm1', messages }, auth);
    // A chat's sequence also holds the opening of the answer's turn, as the mocker's cache hashes it.
    assert.deepEqual(chat.body.token_ids, mockerTokenIds('system: be brief\nuser: hello assistant:'));
    const cont = await call('POST', `${w.requestUrl}/tokenize`, { model: 'm1', prompt: 'the tide', continuation: { text: ' comes in', completion_tokens: 2 } }, auth);
    assert.deepEqual(cont.body.token_ids, mockerTokenIds('the tide comes in'));
    const empty = await call('POST', `${w.requestUrl}/tokenize`, { model: 'm1' }, auth);
    assert.equal(empty.status, 400);
    assert.equal(empty.body.error.code, 'invalid_request');
  });

  it('needs the request-plane token like every route', async () => {
    const res = await call('POST', `${w.requestUrl}/tokenize`, { model: 'm1', prompt: 'x' });
    assert.equal(res.status, 401);
  });

  it('takes at most MAX_TOKENIZING calls at once, bodies still arriving included; past it 503 worker_overloaded', async () => {
    // Each promises a 3 MiB body and sends a byte of it: the call is in progress until its socket closes.
    const held = await Promise.all(
      Array.from({ length: MAX_TOKENIZING }, async () => {
        const c = await rawConnect(w.requestUrl);
        c.socket.write(`POST /tokenize HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer tok-123\r\ncontent-type: application/json\r\ncontent-length: ${3 << 20}\r\n\r\n{`);
        return c;
      }),
    );
    // The server has taken every held call once one call after them is refused (one connection, in order).
    let res = await call('POST', `${w.requestUrl}/tokenize`, { model: 'm1', prompt: 'a b' }, auth);
    for (let i = 0; res.status === 200 && i < 100; i++) res = await call('POST', `${w.requestUrl}/tokenize`, { model: 'm1', prompt: 'a b' }, auth);
    assert.equal(res.status, 503, JSON.stringify(res.body));
    assert.equal(res.body.error.code, 'worker_overloaded');
    for (const c of held) c.socket.destroy();
    await bounded(Promise.all(held.map((c) => c.closed)), 'the held calls closed');
    // The worker sees the closes on its own schedule: answered again once it has.
    await bounded(
      (async () => {
        while ((res = await call('POST', `${w.requestUrl}/tokenize`, { model: 'm1', prompt: 'a b' }, auth)).status !== 200) assert.equal(res.body.error.code, 'worker_overloaded');
      })(),
      'a tokenize call answered after the held ones closed',
    );
  });

  it('is refused while the worker drains (admission is closed): 503 worker_draining', async () => {
    const drain = await call('POST', `${w.systemUrl}/engine/drain`);
    assert.ok(drain.status === 200 || drain.status === 202, JSON.stringify(drain.body));
    const res = await call('POST', `${w.requestUrl}/tokenize`, { model: 'm1', prompt: 'a b' }, auth);
    assert.equal(res.status, 503, JSON.stringify(res.body));
    assert.equal(res.body.error.code, 'worker_draining');
  });
});
