import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import type { ServerResponse } from 'node:http';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { call, fakeWorker, injectRecord, json, parseRawResponse, rawConnect } from './helpers/http.js';
import { bounded, metricValue, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { streamCompletion } from './helpers/sse.js';

const started: EbbProcess[] = [];
const fakes: Array<{ close(): Promise<void> }> = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
  await Promise.all(fakes.map((f) => f.close()));
});

type Frontend = FrontendHandle & { adminUrl: string };

async function frontend(discovery: string, args: string[] = []): Promise<Frontend> {
  const fe = await startFrontend(discovery, ['--admin-port', '0', ...args]);
  started.push(fe);
  const ready = await fe.waitForEvent('frontend_ready');
  return Object.assign(fe, { adminUrl: ready.admin_url as string });
}

async function worker(discovery: string, args: string[] = []): Promise<WorkerHandle> {
  const w = await startWorker(['--discovery', discovery, '--model', 'm1', ...args]);
  started.push(w);
  return w;
}

/** The frontend routes to `id`: listed in its first view or added later (after `from` log lines). */
function sees(fe: EbbProcess, id: string, from = 0) {
  return fe.waitForLog(
    (l) => fe.logs.indexOf(l) >= from && ((l.event === 'worker_added' && l.worker_id === id) || (l.event === 'discovery_reset' && (l.workers as string[]).includes(id))),
    `frontend sees ${id}`,
  );
}

const inflight = (fe: FrontendHandle, id: string) => metricValue(fe.url, 'ebb_frontend_worker_inflight_requests', `worker_id="${id}"`);

const DRAINING = { error: { code: 'worker_draining', message: 'draining', type: 'service_unavailable', retryable: true } };

function tokenFile(token: string): string {
  const path = join(mkdtempSync(join(tmpdir(), 'ebb-test-token-')), 'token');
  writeFileSync(path, `${token}\n`, { mode: 0o600 });
  return path;
}

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve));
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((resolve) => s.close(() => resolve()));
  return port;
}

/** A fake worker that streams `lines` (NDJSON) on /generate, then runs `end` once the test calls `proceed` (the client has seen the tokens). */
async function streamingFake(lines: unknown[], end: (res: ServerResponse) => void) {
  let proceed!: () => void;
  const gate = new Promise<void>((resolve) => (proceed = resolve));
  const fake = await fakeWorker((req, res) => {
    if (req.url !== '/generate') return json(res, 404, {});
    res.writeHead(200, { 'content-type': 'application/x-ndjson' });
    res.write(lines.map((l) => JSON.stringify(l) + '\n').join(''));
    void gate.then(() => end(res));
  });
  fakes.push(fake);
  return Object.assign(fake, { proceed });
}

/**
 * One worker (its id not a legal header value, 20 ms a token) behind one frontend, shared by the tests
 * that leave it serving with nothing in flight; the last one kills it.
 */
let shared: Promise<{ discovery: string; w: WorkerHandle; fe: Frontend }> | undefined;
function sharedFleet() {
  return (shared ??= (async () => {
    const discovery = tempDiscoveryUrl();
    const w = await worker(discovery, ['--worker-id', 'w☃-1', '--mocker-itl-ms', '20']);
    // No admission queue: a refusal is answered at once (the in-flight accounting test reads it).
    const fe = await frontend(discovery, ['--queue-timeout', '0']);
    await sees(fe, w.workerId);
    return { discovery, w, fe };
  })());
}

describe('frontend admin: bodies', () => {
  it('answers 400 to a drain body with an unknown field', async () => {
    const { w, fe } = await sharedFleet();
    const res = await call('POST', `${fe.adminUrl}/workers/${encodeURIComponent(w.workerId)}/drain`, { reason: 'x', bogus: 1 });
    assert.equal(res.status, 400);
    assert.deepEqual([res.body.error.code, res.body.error.param], ['unknown_parameter', 'bogus']);
    assert.equal((await call('GET', `${w.systemUrl}/engine/status`)).body.state, 'serving', 'nothing was forwarded');
  });
});

describe('frontend: in-flight accounting', () => {
  it('streams from a worker whose id is not a legal header value, and releases it', async () => {
    const { w, fe } = await sharedFleet();
    assert.equal(w.workerId, 'w☃-1');
    const r = await bounded(streamCompletion(fe.url, { model: 'm1', max_tokens: 4 }), 'the stream');
    assert.equal(r.status, 200, r.error);
    assert.equal(r.tokens, 4);
    assert.equal(r.done, true);
    assert.equal(r.workerId, encodeURIComponent('w☃-1'), 'sent percent-encoded');
    const list = await call('GET', `${fe.adminUrl}/workers`);
    assert.equal(list.body.workers[0].routing.inflight, 0);
  });

  it('keeps a worker in-flight count across drain and resume (it leaves discovery and comes back)', async () => {
    const { w, fe } = await sharedFleet();
    let firsts = 0;
    let bothStarted!: () => void;
    const running = new Promise<void>((resolve) => (bothStarted = resolve));
    const streams = [0, 1].map((i) => streamCompletion(fe.url, { model: 'm1', max_tokens: 150, seed: i }, () => ++firsts === 2 && bothStarted()));
    await running;
    const mark = fe.logs.length;
    await call('POST', `${w.systemUrl}/engine/drain`);
    await fe.waitForLog((l) => fe.logs.indexOf(l) >= mark && l.event === 'worker_removed' && l.worker_id === w.workerId, 'worker_removed');
    await call('POST', `${w.systemUrl}/engine/resume`);
    await sees(fe, w.workerId, mark);
    const listed = await call('GET', `${fe.adminUrl}/workers`);
    assert.equal(listed.body.workers[0].routing.inflight, 2, 'its two open streams still count');
    for (const r of await Promise.all(streams)) assert.equal(r.done, true, r.error);
    assert.equal(await inflight(fe, w.workerId), 0);
  });

  it('does not try a worker that refused as draining again for the next requests', async () => {
    const discovery = tempDiscoveryUrl();
    const w = await worker(discovery);
    const refusing = await fakeWorker((_req, res) => json(res, 503, DRAINING));
    fakes.push(refusing);
    injectRecord(discovery, { worker_id: 'w-refusing', model: 'm1', request_url: refusing.url, system_url: refusing.url });
    const fe = await frontend(discovery);
    await sees(fe, w.workerId);
    await sees(fe, 'w-refusing');
    for (let i = 0; i < 6; i++) {
      const r = await call('POST', `${fe.url}/v1/completions`, { model: 'm1', prompt: 'x', max_tokens: 2 });
      assert.equal(r.status, 200);
    }
    assert.equal(refusing.seen.filter((r) => r.url === '/generate').length, 1, 'refused once, then held out while still listed');
  });
});

describe('frontend: streams that break', () => {
  it('relays a worker_shut_down terminal line as the worker said it', async () => {
    const discovery = tempDiscoveryUrl();
    const message = 'worker w-f shut down before the stream finished';
    const fake = await streamingFake([{ text: 'a' }, { text: 'b' }], (res) => res.end(JSON.stringify({ error: { code: 'worker_shut_down', message } }) + '\n'));
    injectRecord(discovery, { worker_id: 'w-f', model: 'm1', request_url: fake.url, system_url: fake.url });
    const fe = await frontend(discovery);
    await sees(fe, 'w-f');
    const r = await streamCompletion(fe.url, { model: 'm1' }, () => fake.proceed());
    assert.equal(r.tokens, 2);
    assert.equal(r.errorCode, 'worker_shut_down');
    assert.ok(r.error?.startsWith(`${message}; no other worker continued it: `), r.error);
  });

  it('says which worker closed the stream when its connection just ends', async () => {
    const discovery = tempDiscoveryUrl();
    const fake = await streamingFake([{ text: 'a' }], (res) => res.socket?.destroy());
    injectRecord(discovery, { worker_id: 'w-f', model: 'm1', request_url: fake.url, system_url: fake.url });
    const fe = await frontend(discovery);
    await sees(fe, 'w-f');
    const r = await streamCompletion(fe.url, { model: 'm1' }, () => fake.proceed());
    assert.equal(r.tokens, 1);
    assert.equal(r.errorCode, 'worker_failed_mid_stream');
    assert.ok(r.error?.startsWith('worker w-f closed the stream before it finished; no other worker continued it: '), r.error);
  });

  it('ends a stream whose worker sends a line past the line bound without a newline, and keeps serving others', async () => {
    const discovery = tempDiscoveryUrl();
    // 2 MiB with no newline, in 64 KiB writes, then the connection stays open: only the bound ends it.
    const endless = Buffer.alloc(64 * 1024, 'x');
    const fake = await streamingFake([{ text: 'a' }], (res) => {
      for (let i = 0; i < 32; i++) res.write(endless);
    });
    injectRecord(discovery, { worker_id: 'w-f', model: 'm1', request_url: fake.url, system_url: fake.url });
    const fe = await frontend(discovery);
    await sees(fe, 'w-f');
    const r = await bounded(streamCompletion(fe.url, { model: 'm1' }, () => fake.proceed()), 'the stream ended by the frontend once the line passed its bound');
    assert.equal(r.tokens, 1);
    assert.equal(r.errorCode, 'worker_failed_mid_stream');
    assert.ok(r.error?.startsWith('worker w-f failed mid-stream: a stream line over 1048576 bytes without a newline'), r.error);
    assert.equal((await call('GET', `${fe.url}/health`)).status, 200, 'another client is still answered');
  });

  it('disconnects a streaming client that reads nothing past --client-write-timeout-ms, and frees its worker', async () => {
    const discovery = tempDiscoveryUrl();
    const w = await worker(discovery, ['--mocker-itl-ms', '0', '--mocker-max-context', '10000000']);
    const fe = await frontend(discovery, ['--client-write-timeout-ms', '300']);
    await sees(fe, w.workerId);
    const conn = await rawConnect(fe.url);
    // Never read: the answer (far more than the socket buffers hold) fills them, then nothing moves.
    conn.socket.pause();
    const body = JSON.stringify({ model: 'm1', prompt: 'x', max_tokens: 1_000_000, stream: true });
    conn.socket.write(`POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
    await bounded(
      (async () => {
        while ((await inflight(fe, w.workerId)) !== 1);
        while ((await inflight(fe, w.workerId)) !== 0);
      })(),
      'the request taken, then its worker released by the frontend',
    );
    // What the kernel still holds for it is finite now: read, it ends in the close.
    conn.socket.resume();
    await bounded(conn.closed, 'the frontend having closed the connection');
  });

  it('answers a client that half-closes after sending its request', async () => {
    const { fe } = await sharedFleet();
    const body = JSON.stringify({ model: 'm1', prompt: 'x', max_tokens: 3 });
    const conn = await rawConnect(fe.url);
    conn.socket.write(`POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
    conn.socket.end(); // like nc -N
    const res = parseRawResponse(await bounded(conn.closed, 'the response'));
    assert.equal(res.status, 200, res.headers);
    assert.equal(res.body.object, 'text_completion');
    assert.equal(res.body.usage.completion_tokens, 3);
  });
});

describe('frontend: disaggregated serving does not leak KV', () => {
  it('answers 503 without a decode worker, and releases the KV when the decode worker refuses', async () => {
    const discovery = tempDiscoveryUrl();
    const prefill = await worker(discovery, ['--mode', 'prefill', '--kv-transfer-ttl-ms', '600000']);
    // No admission queue: a refusing decode worker is answered for at once.
    const fe = await frontend(discovery, ['--queue-timeout', '0']);
    await sees(fe, prefill.workerId);
    const pending = async () => (await call('GET', `${prefill.systemUrl}/engine/status`)).body.engine.kv_transfers_pending;

    const none = await call('POST', `${fe.url}/v1/completions`, { model: 'm1', prompt: 'x' });
    assert.equal(none.status, 503);
    assert.equal(none.body.error.code, 'no_serving_worker');
    assert.equal(await pending(), 0, 'no prefill ran for a request no decode worker could take');

    const decode = await fakeWorker((_req, res) => json(res, 503, DRAINING));
    fakes.push(decode);
    injectRecord(discovery, { worker_id: 'w-decode', model: 'm1', mode: 'decode', request_url: decode.url, system_url: decode.url });
    await sees(fe, 'w-decode');
    for (let i = 0; i < 3; i++) {
      const r = await call('POST', `${fe.url}/v1/completions`, { model: 'm1', prompt: `x${i}` });
      assert.equal(r.status, 503);
      assert.equal(r.body.error.code, 'no_serving_worker');
    }
    assert.equal(decode.seen.length, 1, 'refused once, then held out');
    assert.deepEqual(Object.keys(JSON.parse(decode.seen[0]!.body).kv_transfer).sort(), ['cached_tokens', 'source_url', 'transfer_id', 'worker_id']);
    assert.equal(await pending(), 0, 'the refused transfer was released on the prefill worker');
    const drained = await call('POST', `${prefill.systemUrl}/engine/drain`);
    assert.equal(drained.body.state, 'drained', 'nothing pending holds the drain');
  });

  it('sends the request-plane token on /generate, /prefill and the KV release', async () => {
    const discovery = tempDiscoveryUrl();
    const prefill = await fakeWorker((req, res) => {
      if (req.method === 'POST' && req.url === '/prefill') return json(res, 200, { transfer_id: 't1', source_url: prefill.url, worker_id: 'w-p', prompt_tokens: 1, kv_bytes: 1 });
      res.writeHead(204).end();
    });
    const decode = await fakeWorker((_req, res) => json(res, 503, DRAINING));
    fakes.push(prefill, decode);
    injectRecord(discovery, { worker_id: 'w-p', model: 'm1', mode: 'prefill', request_url: prefill.url, system_url: prefill.url });
    injectRecord(discovery, { worker_id: 'w-d', model: 'm1', mode: 'decode', request_url: decode.url, system_url: decode.url });
    const fe = await frontend(discovery, ['--request-token-file', tokenFile('rp-tok'), '--queue-timeout', '0']);
    await sees(fe, 'w-p');
    await sees(fe, 'w-d');
    assert.equal((await call('POST', `${fe.url}/v1/completions`, { model: 'm1', prompt: 'x' })).status, 503);
    assert.deepEqual(
      prefill.seen.map((r) => [r.method, r.url, r.authorization]),
      [
        ['POST', '/prefill', 'Bearer rp-tok'],
        ['DELETE', '/kv/t1', 'Bearer rp-tok'],
      ],
    );
    assert.deepEqual(decode.seen.map((r) => [r.url, r.authorization]), [['/generate', 'Bearer rp-tok']]);
    assert.deepEqual(JSON.parse(decode.seen[0]!.body).kv_transfer, { transfer_id: 't1', source_url: prefill.url, worker_id: 'w-p' });
  });
});

describe('frontend admin: worker identity', () => {
  it('refuses to drain by id when another worker now answers on the remembered system port', async () => {
    const discovery = tempDiscoveryUrl();
    const port = String(await freePort());
    const a = await worker(discovery, ['--system-port', port]);
    const fe = await frontend(discovery);
    await sees(fe, a.workerId);
    const mark = fe.logs.length;
    a.signal('SIGKILL');
    await a.exitCode();
    await fe.waitForLog((l) => fe.logs.indexOf(l) >= mark && l.event === 'worker_removed' && l.worker_id === a.workerId, 'A leaves discovery');
    const b = await worker(discovery, ['--system-port', port]);
    await sees(fe, b.workerId, mark);
    const res = await call('POST', `${fe.adminUrl}/workers/${a.workerId}/drain`, { reason: 'meant for A' });
    assert.equal(res.status, 502);
    assert.equal(res.body.error.code, 'worker_identity_mismatch');
    assert.equal((await call('GET', `${b.systemUrl}/engine/status`)).body.state, 'serving', 'B was not drained');
  });

  it('never sends the bearer token to a server that is not the worker asked for', async () => {
    const discovery = tempDiscoveryUrl();
    const impostor = await fakeWorker((req, res) => {
      if (req.url === '/engine/status') return json(res, 200, { worker_id: 'w-other', state: 'serving', inflight_requests: 0 });
      json(res, 200, { worker_id: 'w-other', state: 'drained', inflight_requests: 0 });
    });
    // Right id in its status, someone else in its drain reply.
    const liar = await fakeWorker((req, res) => json(res, 200, { worker_id: req.url === '/engine/status' ? 'w-liar' : 'w-other', state: 'serving', inflight_requests: 0 }));
    fakes.push(impostor, liar);
    injectRecord(discovery, { worker_id: 'w-impostor', model: 'm1', request_url: impostor.url, system_url: impostor.url });
    injectRecord(discovery, { worker_id: 'w-liar', model: 'm1', request_url: liar.url, system_url: liar.url });
    const fe = await frontend(discovery, ['--admin-token-file', tokenFile('admin-tok')]);
    await sees(fe, 'w-impostor');
    await sees(fe, 'w-liar');
    const auth = { authorization: 'Bearer admin-tok' };
    for (const action of ['drain', 'resume']) {
      const res = await call('POST', `${fe.adminUrl}/workers/w-impostor/${action}`, undefined, auth);
      assert.equal(res.status, 502);
      assert.equal(res.body.error.code, 'worker_identity_mismatch');
    }
    assert.deepEqual(impostor.seen.filter((r) => r.method !== 'GET'), [], 'nothing forwarded');
    assert.deepEqual(impostor.seen.map((r) => r.authorization).filter((a) => a !== undefined), [], 'the token never left');
    const lied = await call('POST', `${fe.adminUrl}/workers/w-liar/drain`, undefined, auth);
    assert.equal(lied.status, 502);
    assert.equal(lied.body.error.code, 'worker_identity_mismatch');
  });
});

describe('frontend: SIGTERM bounds the admin listener too', () => {
  it('exits within --shutdown-timeout-ms despite a stalled admin request', async () => {
    const fe = await frontend(tempDiscoveryUrl(), ['--shutdown-timeout-ms', '500', '--shutdown-grace-ms', '0']);
    const stalled = await rawConnect(fe.adminUrl);
    stalled.socket.write('POST /workers/w-x/drain HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"rea');
    // The request reached the listener: a second connection's answer comes after it was parsed.
    assert.equal((await call('GET', `${fe.adminUrl}/workers`)).status, 200);
    fe.signal('SIGTERM');
    // Well under the admin request timeout (30 s), which would end it on its own.
    assert.equal(await fe.exitCode(10_000), 1, 'exit 1: a connection had to be cut');
    await bounded(stalled.closed, 'the stalled socket closed');
  });
});

// Last: it kills the shared worker.
describe('frontend: in-flight accounting, every ending', () => {
  it('is back to 0 after every kind of ending: completed, non-streaming, client abort, worker killed, refusal', async () => {
    const { discovery, w, fe } = await sharedFleet();
    const refusing = await fakeWorker((_req, res) => json(res, 503, DRAINING));
    fakes.push(refusing);

    const done = await streamCompletion(fe.url, { model: 'm1', max_tokens: 3 });
    assert.equal(done.done, true, done.error);
    assert.equal(await inflight(fe, w.workerId), 0, 'after a completed stream');

    const plain = await call('POST', `${fe.url}/v1/completions`, { model: 'm1', prompt: 'x', max_tokens: 3 });
    assert.equal(plain.status, 200);
    assert.equal(await inflight(fe, w.workerId), 0, 'after a non-streaming request');

    const controller = new AbortController();
    const res = await fetch(`${fe.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm1', messages: [{ role: 'user', content: 'x' }], stream: true, max_tokens: 10_000 }),
      signal: controller.signal,
    });
    const reader = (res.body as ReadableStream<Uint8Array>).getReader();
    await reader.read();
    assert.equal(await inflight(fe, w.workerId), 1, 'counted while open');
    // The frontend is shared: only a client_gone from now on counts.
    const gone = fe.waitForNextEvent('client_gone');
    controller.abort();
    await gone;
    assert.equal(await inflight(fe, w.workerId), 0, 'after the client left mid-stream');

    injectRecord(discovery, { worker_id: 'w-refusing', model: 'm2', request_url: refusing.url, system_url: refusing.url });
    await sees(fe, 'w-refusing');
    const refused = await call('POST', `${fe.url}/v1/completions`, { model: 'm2', prompt: 'x' });
    assert.equal(refused.status, 503);
    assert.equal(await inflight(fe, 'w-refusing'), 0, 'after a refusal');

    const cut = await streamCompletion(fe.url, { model: 'm1', max_tokens: 10_000 }, () => w.signal('SIGKILL'));
    assert.equal(cut.done, false);
    assert.equal(cut.errorCode, 'worker_failed_mid_stream');
    assert.equal(await inflight(fe, w.workerId), 0, 'after the worker died mid-stream');
  });
});
