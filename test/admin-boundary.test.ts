/**
 * The admin boundary (issue 22, "The admin boundary"): what a web page, a discovery record, a flood
 * of slow connections or a hostile worker answer can do to the admin listeners and the operator's
 * terminal. One token-less fleet (a worker, a frontend with its admin listener) serves every case.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { once } from 'node:events';
import type { ServerResponse } from 'node:http';
import { promisify } from 'node:util';
import { prettyFactory } from 'pino-pretty';
import { request } from 'undici';
import { prettyOptions } from '../src/common/logger.js';
import { call, fakeWorker, injectRecord, json, openLineStream, rawConnect, type FakeWorker, type RawConnection } from './helpers/http.js';
import { bounded, CLI, spawnEbb, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';

const NO_TOKEN = { EBB_ADMIN_TOKEN: undefined, EBB_ADMIN_ORIGINS: undefined };
/** Over Fastify's default bound on a path parameter (100 characters): it answered 414 for such an id. */
const LONG_ID = `w-${'x'.repeat(150)}`;

const started: EbbProcess[] = [];
const fakes: FakeWorker[] = [];
const sockets: RawConnection[] = [];
after(async () => {
  for (const c of sockets) c.socket.destroy();
  await Promise.all([...started.map((p) => p.stop()), ...fakes.map((f) => f.close())]);
});

let discovery: string;
let worker: WorkerHandle;
let fe: FrontendHandle & { adminUrl: string };

function sees(p: EbbProcess, id: string) {
  return p.waitForLog(
    (l) => (l.event === 'worker_added' && l.worker_id === id) || (l.event === 'discovery_reset' && (l.workers as string[]).includes(id)),
    `frontend sees ${id}`,
  );
}

/** A request with headers fetch() will not send (Host): the answer's status and JSON body. */
async function raw(method: string, url: string, headers: Record<string, string>, body?: string): Promise<{ status: number; body: any }> {
  const res = await request(url, { method: method as 'GET', headers, body });
  const text = await res.body.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    /* keep the text */
  }
  return { status: res.statusCode, body: parsed };
}

const stateOf = async (): Promise<string> => (await call('GET', `${worker.systemUrl}/engine/status`)).body.state;

before(async () => {
  discovery = tempDiscoveryUrl();
  worker = await startWorker(['--discovery', discovery, '--model', 'm1', '--worker-id', LONG_ID], NO_TOKEN);
  started.push(worker);
  // least-loaded: the kv router's KV event stream would hold one of the worker's admin connections,
  // and the flood test below fills that budget exactly.
  const f = await startFrontend(discovery, ['--admin-port', '0', '--router', 'least-loaded'], NO_TOKEN);
  started.push(f);
  const ready = await f.waitForEvent('frontend_ready');
  fe = Object.assign(f, { adminUrl: ready.admin_url as string });
  await sees(fe, LONG_ID);
});

describe('admin boundary: browsers (item 11)', () => {
  it('refuses a cross-origin POST without a body on a token-less worker (it drained it)', async () => {
    const res = await raw('POST', `${worker.systemUrl}/engine/drain`, { origin: 'http://evil.example' });
    assert.equal(res.status, 403, JSON.stringify(res.body));
    assert.equal(res.body.error.code, 'forbidden');
    assert.equal(await stateOf(), 'serving');
    const viaFrontend = await raw('POST', `${fe.adminUrl}/workers/${LONG_ID}/drain`, { origin: 'http://evil.example' });
    assert.equal(viaFrontend.status, 403);
    assert.equal(await stateOf(), 'serving');
  });

  it('refuses a DNS-rebinding page (Origin and Host both evil:PORT) on both listeners; probes still answer', async () => {
    for (const [base, drain, read] of [
      [worker.systemUrl, '/engine/drain', '/engine/status'],
      [fe.adminUrl, `/workers/${LONG_ID}/drain`, '/workers'],
    ] as const) {
      const port = new URL(base).port;
      const rebound = { host: `evil.example:${port}`, origin: `http://evil.example:${port}` };
      const posted = await raw('POST', `${base}${drain}`, { ...rebound, 'content-type': 'application/json' }, '{}');
      assert.equal(posted.status, 403, `${base}: ${JSON.stringify(posted.body)}`);
      const read1 = await raw('GET', `${base}${read}`, rebound);
      assert.equal(read1.status, 403, `${base}${read} read through a rebound name`);
      assert.equal((await raw('GET', `${base}${read}`, { host: `evil.example:${port}` })).status, 403, 'a foreign Host alone');
    }
    assert.equal((await raw('GET', `${worker.systemUrl}/live`, { host: 'evil.example' })).status, 200, 'probes answer under any name');
    assert.equal(await stateOf(), 'serving');
  });

  it('takes only JSON mutations from a browser, and any body as JSON; the own origin (dashboard) and curl -X POST still work', async () => {
    const own = new URL(fe.adminUrl).origin;
    const text = await raw('POST', `${fe.adminUrl}/workers/${LONG_ID}/drain`, { origin: own, 'content-type': 'text/plain' }, '{"reason":"x"}');
    assert.equal(text.status, 415, JSON.stringify(text.body));
    assert.equal(text.body.error.code, 'unsupported_media_type');
    const form = await raw('POST', `${worker.systemUrl}/engine/drain`, { 'content-type': 'application/x-www-form-urlencoded' }, 'reason=x');
    assert.equal(form.status, 415);
    const bare = await raw('POST', `${fe.adminUrl}/workers/${LONG_ID}/drain`, { origin: own });
    assert.equal(bare.status, 415, 'a browser POST without a JSON type');
    assert.equal(await stateOf(), 'serving');

    const dashboard = await raw('POST', `${fe.adminUrl}/workers/${encodeURIComponent(LONG_ID)}/drain`, { origin: own, 'content-type': 'application/json' }, '{"reason":"boundary test"}');
    assert.ok(dashboard.status === 200 || dashboard.status === 202, JSON.stringify(dashboard.body));
    const back = fe.mark();
    const curl = await raw('POST', `${worker.systemUrl}/engine/resume`, {});
    assert.equal(curl.status, 200, JSON.stringify(curl.body));
    assert.equal(curl.body.state, 'serving');
    await fe.waitForEvent('worker_added', (l) => l.worker_id === LONG_ID, { after: back });
  });

  it('with a token, answers under any Host name (pod IPs, Service names): the bearer token guards mutations and reads', async () => {
    const w = await startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'm1'], { EBB_ADMIN_TOKEN: 'tok', EBB_ADMIN_ORIGINS: undefined });
    started.push(w);
    const port = new URL(w.systemUrl).port;
    const elsewhere = { host: `10.1.2.3:${port}` };
    assert.equal((await raw('GET', `${w.systemUrl}/engine/status`, elsewhere)).status, 401, 'a read needs the token too');
    assert.equal((await raw('GET', `${w.systemUrl}/engine/status`, { ...elsewhere, authorization: 'Bearer tok' })).status, 200);
    assert.equal((await raw('POST', `${w.systemUrl}/engine/drain`, { ...elsewhere, origin: `http://10.1.2.3:${port}` })).status, 415, 'a browser POST still needs JSON');
    const rebound = await raw('POST', `${w.systemUrl}/engine/drain`, { ...elsewhere, origin: `http://10.1.2.3:${port}`, 'content-type': 'application/json' }, '{}');
    assert.equal(rebound.status, 401, 'and the token');
    const drained = await raw('POST', `${w.systemUrl}/engine/drain`, { ...elsewhere, authorization: 'Bearer tok' });
    assert.ok(drained.status === 200 || drained.status === 202, JSON.stringify(drained.body));
    await w.stop();
  });
});

/** Writes `head` then filler until `max` bytes went out or the reader hung up; resolves with what was written. */
async function pour(res: ServerResponse, head: string, filler: string, max: number): Promise<number> {
  let written = 0;
  let closed = false;
  const hungUp = new Promise<void>((resolve) => res.once('close', () => resolve(void (closed = true))));
  const chunk = Buffer.from(filler.repeat(Math.ceil(65536 / filler.length)));
  res.write(head);
  while (written < max && !closed) {
    written += chunk.length;
    if (!res.write(chunk)) await Promise.race([once(res, 'drain'), hungUp]);
  }
  res.end();
  return written;
}

describe('admin boundary: discovery records (items 12, 15)', () => {
  const POUR_MAX = 64 * 1024 * 1024;
  const written: Record<string, number> = {};
  let meta: FakeWorker;
  let impostor: FakeWorker;
  let big: FakeWorker;

  before(async () => {
    // A service that is no worker (a metadata endpoint), one that answers as another worker, one that never stops answering.
    meta = await fakeWorker((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end('SECRET-CREDENTIALS AKIA0000');
    });
    impostor = await fakeWorker((_req, res) => json(res, 200, { worker_id: 'w-someone-else', state: 'serving', inflight_requests: 0, secret: 'SECRET-FROM-IMPOSTOR' }));
    big = await fakeWorker((req, res) => {
      const events = req.url.startsWith('/engine/status/events');
      res.writeHead(200, { 'content-type': events ? 'text/event-stream' : 'application/json' });
      void pour(res, events ? 'event: status\ndata: "' : '{"worker_id":"w-big","state":"', 'a', POUR_MAX).then((n) => (written[req.url] = n));
    });
    fakes.push(meta, impostor, big);
    injectRecord(discovery, { worker_id: '..', model: 'm1', request_url: meta.url, system_url: meta.url });
    injectRecord(discovery, { worker_id: 'w-path', model: 'm1', request_url: meta.url, system_url: `${meta.url}/latest/meta-data/?x=` });
    injectRecord(discovery, { worker_id: 'w-meta', model: 'm1', request_url: meta.url, system_url: meta.url });
    injectRecord(discovery, { worker_id: 'w-impostor', model: 'm1', request_url: impostor.url, system_url: impostor.url });
    injectRecord(discovery, { worker_id: 'w-big', model: 'm1', request_url: big.url, system_url: big.url });
    for (const id of ['w-meta', 'w-impostor', 'w-big']) await sees(fe, id);
  });

  it('lists what a record points at only as far as it proves to be that worker: nothing else is echoed', async () => {
    const list = await call('GET', `${fe.adminUrl}/workers`);
    assert.equal(list.status, 200);
    const byId = new Map((list.body.workers as Array<{ worker_id: string }>).map((w) => [w.worker_id, w as any]));
    assert.equal(byId.get('w-meta')?.reachable, false);
    assert.equal(byId.get('w-impostor')?.reachable, false, 'answered as another worker');
    assert.match(byId.get('w-impostor')?.error ?? '', /w-someone-else/);
    assert.doesNotMatch(JSON.stringify(list.body), /SECRET/, 'no answer of an unverified URL comes back');
    assert.equal(byId.get(LONG_ID)?.reachable, true);
  });

  it("never sends the operator's token to a record that is not that worker", async () => {
    const res = await call('POST', `${fe.adminUrl}/workers/w-meta/drain`, {}, { authorization: 'Bearer operator-secret' });
    assert.equal(res.status, 502, JSON.stringify(res.body));
    assert.doesNotMatch(JSON.stringify(res.body), /SECRET/);
    assert.deepEqual(meta.seen.filter((r) => r.method !== 'GET' || r.authorization !== undefined), [], 'only unauthenticated status reads');
  });

  it('reads a bounded amount from a worker answering without end, in its status and its event stream', async () => {
    assert.equal((await call('GET', `${fe.adminUrl}/workers/w-big`)).body.reachable, false);
    const res = await fetch(`${fe.adminUrl}/workers/events`);
    const reader = (res.body as ReadableStream<Uint8Array>).getReader();
    const decoder = new TextDecoder();
    let text = '';
    await bounded(
      (async () => {
        while (!/event: worker_unreachable\ndata: \{"worker_id":"w-big"/.test(text)) {
          const { value, done } = await reader.read();
          if (done) throw new Error('fleet stream ended');
          text += decoder.decode(value, { stream: true });
        }
      })(),
      'worker_unreachable for w-big on the fleet stream',
    );
    await reader.cancel();
    await bounded(
      (async () => {
        while (written['/engine/status'] === undefined || written['/engine/status/events'] === undefined) await new Promise((r) => setTimeout(r, 50));
      })(),
      'the fake worker seeing both readers hang up',
    );
    for (const [path, n] of Object.entries(written)) assert.ok(n < 16 * 1024 * 1024, `${path}: the frontend read ${n} bytes before hanging up`);
  });

  it('ignores records whose id cannot be addressed (..) or whose system URL is not an origin', async () => {
    const ids = (await call('GET', `${fe.adminUrl}/workers`)).body.workers.map((w: { worker_id: string }) => w.worker_id);
    assert.ok(!ids.includes('..'), `listed: ${ids.join(', ')}`);
    assert.ok(!ids.includes('w-path'), `listed: ${ids.join(', ')}`);
  });

  it('addresses an id over 100 characters (414 before), and a worker refuses --worker-id values it could not be addressed by', async () => {
    const one = await call('GET', `${fe.adminUrl}/workers/${encodeURIComponent(LONG_ID)}`);
    assert.equal(one.status, 200, JSON.stringify(one.body));
    assert.equal(one.body.worker_id, LONG_ID);
    const tooLong = await call('GET', `${fe.adminUrl}/workers/${'y'.repeat(2000)}`);
    assert.equal(tooLong.body.error?.code, 'invalid_request', 'ebb JSON past the bound, not fastify\'s');
    await Promise.all(
      ['..', 'a/b', 'w\x1b[2J', 'x'.repeat(300)].map(async (bad) => {
        const p = spawnEbb(['worker', '--port', '0', '--system-port', '0', '--discovery', discovery, '--worker-id', bad], 'bad-id worker', NO_TOKEN);
        started.push(p);
        // Four processes start at once: a generous bound on a loaded machine (they exit at argument parsing).
        assert.notEqual(await p.exitCode(60_000), 0, `--worker-id ${JSON.stringify(bad.slice(0, 20))} was taken`);
        assert.match(p.stderr.join('\n'), /worker id/);
      }),
    );
  });
});

describe('admin boundary: connection floods (item 13)', () => {
  /** `n` connections each holding half a request (slowloris): the headers never end. */
  async function slowloris(url: string, n: number): Promise<RawConnection[]> {
    const held = await Promise.all(Array.from({ length: n }, () => rawConnect(url)));
    for (const c of held) c.socket.write('GET /live HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ');
    sockets.push(...held);
    return held;
  }

  it('answers probes and the operator on every listener while 100 slow connections each hold one', async () => {
    const held = [...(await slowloris(worker.systemUrl, 100)), ...(await slowloris(fe.adminUrl, 100)), ...(await slowloris(fe.url, 100))];
    // A probe on a fresh connection each time, as kubelet makes them.
    const probe = (url: string) => raw('GET', url, { connection: 'close' });
    assert.equal((await probe(`${worker.systemUrl}/live`)).status, 200);
    assert.equal((await probe(`${worker.systemUrl}/health`)).status, 200);
    assert.equal((await probe(`${fe.url}/health`)).status, 200);
    assert.equal((await probe(`${fe.adminUrl}/workers/${encodeURIComponent(LONG_ID)}`)).status, 200, "the operator's view");
    assert.equal((await probe(`${worker.systemUrl}/engine/status`)).status, 200);
    for (const c of held) c.socket.destroy();
  });

  it('answers probes and the Admin API while 64 event streams are open: streams have a budget of their own (issue 34); one past the cap gets 503 listener_busy', async () => {
    const streams = await Promise.all(Array.from({ length: 64 }, () => rawConnect(worker.systemUrl)));
    sockets.push(...streams);
    // Each stream is under way once its first bytes came back.
    await Promise.all(
      streams.map(async (c) => {
        const first = once(c.socket, 'data');
        c.socket.write('GET /engine/status/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n');
        await bounded(first, 'an event stream opening');
      }),
    );
    const probe = (path: string, method = 'GET') => raw(method, `${worker.systemUrl}${path}`, { connection: 'close' });
    assert.equal((await probe('/live')).status, 200);
    assert.equal((await probe('/health')).status, 200);
    const over = await probe('/engine/status/events');
    assert.equal(over.status, 503, JSON.stringify(over.body));
    assert.equal(over.body.error.code, 'listener_busy');
    const drained = await probe('/engine/drain', 'POST');
    assert.equal(drained.status, 200, JSON.stringify(drained.body));
    assert.equal(drained.body.state, 'drained');
    const resumed = await probe('/engine/resume', 'POST');
    assert.equal(resumed.status, 200, JSON.stringify(resumed.body));
    assert.equal((await probe('/health')).body.state, 'serving');
    for (const c of streams) c.socket.destroy();
  });
});

describe("admin boundary: the frontend's own probes (item 13)", () => {
  it("probes a silent worker's /live once for all its streams, not once per stream (a burst past the system port's budget)", async () => {
    let live = 0;
    let concurrent = 0;
    let maxConcurrent = 0;
    let onProbe: (() => void) | undefined;
    // A worker whose streams send one token and then go quiet; its /live answers after a moment.
    const silent = await fakeWorker((req, res) => {
      if (req.url === '/live') {
        live++;
        maxConcurrent = Math.max(maxConcurrent, ++concurrent);
        setTimeout(() => {
          concurrent--;
          json(res, 200, { status: 'alive', state: 'serving' });
          onProbe?.();
        }, 50);
        return;
      }
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.write(JSON.stringify({ text: 'a' }) + '\n');
    });
    fakes.push(silent);
    const own = tempDiscoveryUrl();
    injectRecord(own, { worker_id: 'w-silent', model: 'm-silent', request_url: silent.url, system_url: silent.url });
    // A probe may take up to 1 s (min(idle timeout, 2 s)): the fake's 50 ms never overlaps a shared one.
    const f = await startFrontend(own, ['--stream-idle-timeout-ms', '1000'], NO_TOKEN);
    started.push(f);
    await sees(f, 'w-silent');
    const streams = await Promise.all(Array.from({ length: 100 }, () => openLineStream(`${f.url}/v1/completions`, { model: 'm-silent', prompt: 'x', max_tokens: 8, stream: true }, '\n\n')));
    try {
      await bounded(Promise.all(streams.map((s) => s.first)), 'the first token on every stream');
      // Every stream went quiet at about the same time: by a second probe, each has wanted one.
      await bounded(new Promise<void>((resolve) => (onProbe = () => live >= 2 && resolve())), 'a second probe');
      assert.equal(maxConcurrent, 1, `${maxConcurrent} probes of one worker at once`);
    } finally {
      for (const s of streams) s.abort();
      await f.stop();
    }
  });
});

describe('admin boundary: terminal output (item 14)', () => {
  const ESC = '\x1b';
  let evil: FakeWorker;

  before(async () => {
    evil = await fakeWorker((_req, res) =>
      json(res, 200, {
        worker_id: 'w-evil',
        state: `serving${ESC}]52;c;ZXZpbA==\x07`,
        inflight_requests: 0,
        generation: 1,
        state_since: new Date().toISOString(),
        admission_open: true,
        discovery_registered: true,
        shutting_down: false,
        waiting_for: [`${ESC}[2Jnothing`],
        drain_reason: 'r\nw-forged  m1  aggregated  serving',
        last_error: `${ESC}]52;c;ZXZpbA==\x07`,
      }),
    );
    fakes.push(evil);
    injectRecord(discovery, { worker_id: 'w-evil', model: `m1${ESC}[2J\u202e`, request_url: evil.url, system_url: evil.url });
    await sees(fe, 'w-evil');
  });

  const ebb = async (...args: string[]) => (await promisify(execFile)(process.execPath, [CLI, ...args], { env: { ...process.env, EBB_ADMIN_TOKEN: '' } })).stdout;

  it('`ebb workers` and `ebb status` show control characters escaped: no escape sequence, no forged row', async () => {
    const table = await ebb('workers', '--frontend', fe.adminUrl);
    assert.ok(!table.includes(ESC) && !table.includes('\x07') && !table.includes('\u202e'), JSON.stringify(table));
    const rows = table.trimEnd().split('\n');
    const listed = JSON.parse(await ebb('workers', '--frontend', fe.adminUrl, '--json')).workers.length;
    assert.equal(rows.length, 1 + listed, 'one line per worker');
    assert.match(table, /m1\\x1b\[2J\\u202e/);
    const status = await ebb('status', 'w-evil', '--frontend', fe.adminUrl);
    assert.ok(!status.includes(ESC) && !status.includes('\x07'), JSON.stringify(status));
    assert.ok(!status.split('\n').some((l) => l.startsWith('w-forged')), status);
    assert.match(status, /drain reason: r\\nw-forged/);
  });

  it('pretty logs show a message quoting remote text escaped', () => {
    const line = prettyFactory(prettyOptions())(JSON.stringify({ level: 30, time: Date.now(), component: 'frontend', msg: `worker w-evil joined for model m1${ESC}]52;c;ZXZpbA==\x07` }));
    assert.ok(!line.includes(ESC) && !line.includes('\x07'), JSON.stringify(line));
    assert.match(line, /frontend: worker w-evil joined for model m1\\x1b\]52/);
  });
});
