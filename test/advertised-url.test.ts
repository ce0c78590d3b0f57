import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { hostname } from 'node:os';
import { advertisedUrl } from '../src/common/http-server.js';
import { call } from './helpers/http.js';
import { startWorker, tempDiscoveryUrl, type WorkerHandle } from './helpers/processes.js';

const started: WorkerHandle[] = [];
after(async () => {
  await Promise.all(started.map((w) => w.stop()));
});

describe('advertised URLs', () => {
  it('never advertises a wildcard address', () => {
    assert.equal(advertisedUrl('http://127.0.0.1:9000'), 'http://127.0.0.1:9000');
    assert.equal(advertisedUrl('http://0.0.0.0:9000'), new URL(`http://${hostname()}:9000`).origin);
    assert.equal(advertisedUrl('http://[::]:9000'), new URL(`http://${hostname()}:9000`).origin);
    assert.equal(advertisedUrl('http://0.0.0.0:9000', 'worker-7.example'), 'http://worker-7.example:9000');
  });

  it('registers the --advertise-host URL of a worker bound to all interfaces, and it serves there', async () => {
    // Off loopback the request plane needs its token.
    const w = await startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'm1', '--host', '0.0.0.0', '--advertise-host', '127.0.0.1'], { EBB_REQUEST_TOKEN: 'fleet' });
    started.push(w);
    assert.match(w.requestUrl, /^http:\/\/127\.0\.0\.1:\d+$/);
    const res = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'hi', max_tokens: 2, stream: false }, { authorization: 'Bearer fleet' });
    assert.equal(res.status, 200);
    assert.equal(res.body.usage.completion_tokens, 2);
  });
});
