import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { call, dripHeaders, parseRawResponse, postOversize, rawConnect } from './helpers/http.js';
import { bounded, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess } from './helpers/processes.js';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

async function frontend(args: string[]) {
  const fe = await startFrontend(tempDiscoveryUrl(), ['--admin-port', '0', ...args]);
  started.push(fe);
  const ready = await fe.waitForEvent('frontend_ready');
  return Object.assign(fe, { adminUrl: ready.admin_url as string });
}

describe('http limits: every listener bounds its connections', () => {
  it('closes a request whose body never finishes with a JSON 408, on the public and the admin listener', async () => {
    const fe = await frontend(['--request-timeout-ms', '500']);
    for (const [url, path] of [
      [fe.url, '/v1/completions'],
      [fe.adminUrl, '/workers/w-x/drain'],
    ] as const) {
      const conn = await rawConnect(url);
      // Promises 100 bytes of body, sends 10, then goes quiet.
      // A loopback Host: a token-less admin listener answers no other name.
      conn.socket.write(`POST ${path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"model":"`);
      const res = parseRawResponse(await bounded(conn.closed, `${url}: the server closing a partial-body request`));
      assert.equal(res.status, 408, res.headers);
      assert.equal(res.body.error.code, 'request_timeout');
      assert.equal(typeof res.body.error.message, 'string');
    }
  });

  it('closes a non-reading socket that drips its headers a byte at a time, past the headers timeout, on both listeners', async () => {
    const fe = await frontend(['--headers-timeout-ms', '300', '--request-timeout-ms', '600']);
    for (const url of [fe.url, fe.adminUrl]) {
      const drip = await dripHeaders(url);
      // Answered 408 at the headers timeout, then closed although it keeps sending and never reads.
      await bounded(drip.closed, `${url}: the server closing a socket that drips headers and never reads`);
    }
  });

  it('answers a body over the limit with a 413 the client reads, not a reset, on the frontend and on a worker\'s request plane', async () => {
    const w = await startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'm1']);
    started.push(w);
    const fe = await frontend([]);
    // 32 MiB, 8 times the 4 MiB limit: more than the kernel buffers, so most of it is unread when the server answers.
    for (const [url, path] of [
      [fe.url, '/v1/completions'],
      [w.requestUrl, '/generate'],
      [w.requestUrl, '/tokenize'],
    ] as const) {
      const sent = await bounded(postOversize(url, path, 32 << 20), `${url}${path}: the answer to an oversize body`);
      assert.equal(sent.socketError, undefined, `${url}${path}: the connection was reset (${sent.socketError}); received: ${sent.answer.slice(0, 200)}`);
      const res = parseRawResponse(sent.answer);
      assert.equal(res.status, 413, res.headers);
      assert.equal(res.body.error.code, 'payload_too_large');
    }
  });

  it('past --max-connections, a new connection displaces one still sending its request and is answered; the admin listener still answers', async () => {
    const fe = await frontend(['--max-connections', '4']);
    const held = await Promise.all([0, 1, 2, 3].map(() => rawConnect(fe.url)));
    // Each holds a half-sent request: the server has them all.
    for (const c of held) c.socket.write('GET /health HTTP/1.1\r\n');
    const extra = await rawConnect(fe.url);
    extra.socket.write('GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n');
    const res = parseRawResponse(await bounded(extra.closed, 'the answer past the budget'));
    assert.equal(res.body.status, 'not_ready', `answered by /health: ${res.headers}`);
    await bounded(Promise.race(held.map((c) => c.closed)), 'a half-sent connection evicted');
    assert.equal(held.filter((c) => c.socket.destroyed).length, 1, 'one connection made room, the others stay open');
    const admin = await call('GET', `${fe.adminUrl}/workers`);
    assert.equal(admin.status, 200, 'the admin listener has a budget of its own');
    for (const c of held) c.socket.destroy();
  });
});

describe('http limits: parser-level errors answer ebb JSON', () => {
  it('answers garbage with 400 invalid_request and an oversized header with 431 header_fields_too_large, then closes', async () => {
    const fe = await frontend([]);
    for (const url of [fe.url, fe.adminUrl]) {
      const garbage = await rawConnect(url);
      garbage.socket.write('THIS IS NOT HTTP\r\n\r\n');
      const bad = parseRawResponse(await bounded(garbage.closed, 'answer to garbage'));
      assert.equal(bad.status, 400, bad.headers);
      assert.match(bad.headers, /content-type: application\/json/i);
      assert.equal(bad.body.error.code, 'invalid_request');
      assert.equal(bad.body.error.type, 'invalid_request_error');

      const big = await rawConnect(url);
      big.socket.write(`GET /health HTTP/1.1\r\nhost: x\r\nx-big: ${'a'.repeat(20_000)}\r\n\r\n`);
      const tooLarge = parseRawResponse(await bounded(big.closed, 'answer to an oversized header'));
      assert.equal(tooLarge.status, 431, tooLarge.headers);
      assert.equal(tooLarge.body.error.code, 'header_fields_too_large');
    }
  });
});
