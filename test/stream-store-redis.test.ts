import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { call } from './helpers/http.js';
import { bounded, frontendSeesWorkers, metricValue, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle } from './helpers/processes.js';
import { redisSkipReason, scriptsRun, startRedis, type RedisServer } from './helpers/redis.js';

/** The shared store's own bounds and health (issue 42 item 5): TTLs, the per-stream bound, a frozen Redis, a refused write, its password. */
describe('the Redis stream store: bounds, health, password', { skip: redisSkipReason() }, () => {
  const started: EbbProcess[] = [];
  let redis: RedisServer;
  let admin: Redis;
  let discovery: string;
  let a: FrontendHandle;
  let b: FrontendHandle;
  before(async () => {
    redis = await startRedis();
    admin = new Redis(redis.url);
    discovery = tempDiscoveryUrl();
    started.push(await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '10', '--mocker-ttft-ms', '0', '--mocker-max-context', '100000']));
    [a, b] = (await Promise.all([0, 1].map(() => startFrontend(discovery, ['--stream-store', redis.url, '--stream-store-max-response-bytes', '20000'])))) as [FrontendHandle, FrontendHandle];
    started.push(a, b);
    await Promise.all([a, b].map((f) => frontendSeesWorkers(f, 1)));
  });
  after(async () => {
    admin?.disconnect();
    await Promise.all(started.map((p) => p.stop()));
    await redis?.stop();
  });

  const KEPT = { 'content-type': 'application/json', 'x-ebb-resumable': '1' };
  const post = (f: FrontendHandle, maxTokens: number) =>
    fetch(`${f.url}/v1/chat/completions`, { method: 'POST', headers: KEPT, body: JSON.stringify({ model: 'm1', messages: [{ role: 'user', content: 'tell me about the tides' }], max_tokens: maxTokens, stream: true }) });
  /** The stream's id and the rest of its body, read once its first event came (`during` runs then). */
  async function stream(res: Response, during: (id: string) => Promise<void> = async () => undefined): Promise<{ id: string; body: string }> {
    let body = '';
    let id = '';
    for await (const chunk of res.body as AsyncIterable<Uint8Array>) {
      body += Buffer.from(chunk).toString('utf8');
      if (id === '' && /"id":"(chatcmpl-[0-9a-f]+)"/.test(body)) {
        id = /"id":"(chatcmpl-[0-9a-f]+)"/.exec(body)![1]!;
        await during(id);
      }
    }
    return { id, body };
  }

  it('the store is said to be connected at start; a live stream\'s keys expire unless renewed (a crashed frontend\'s go), an ended one\'s after the resume window', async () => {
    assert.ok(a.logs.some((l) => l.event === 'stream_store_connected'), 'a line says the store is connected');
    let live: number[] = [];
    const { id } = await stream(await post(a, 100), async (id) => {
      live = await Promise.all([`ebb:{${id}}:meta`, `ebb:{${id}}:events`].map(async (k) => bounded((async () => {
        for (;;) {
          const ttl = await admin.pttl(k);
          if (ttl !== -2) return ttl;
          await sleep(10);
        }
      })(), `${k} to exist`)));
    });
    for (const ttl of live) assert.ok(ttl > 0, `a live stream's keys carry a TTL (got ${ttl})`);
    // This one outgrows the store's bound: its copy is marked 'overflow' at that batch, no longer
    // gated, so the client may have its end before the store does. Its end is in once its lease key
    // is gone (the end's step deletes it; the next case counts the store's scripts from here).
    let state: string | null = null;
    await bounded((async () => {
      while ((state = await admin.hget(`ebb:{${id}}:meta`, 'state')) === 'live' || (await admin.exists(`ebb:{${id}}:lease`)) === 1) await sleep(10);
    })(), `stream ${id}'s copy to end`).catch((err: Error) => assert.fail(`${err.message} (its state: ${state})`));
    const ended = await admin.pttl(`ebb:{${id}}:events`);
    assert.ok(ended > 0 && ended <= 5 * 60_000, `an ended stream's copy lives the resume window (got ${ended})`);
  });

  it('a stream that ends within one batch window is copied by one script (opened, written and ended together), and resumes whole elsewhere', async () => {
    const scripts = await scriptsRun(admin);
    // One token: the worker's answer comes whole, so the stream is written and ended in one turn.
    const { id, body } = await stream(await post(a, 1));
    // The client has its end once the store has it (the end waits for the copy, as every batch).
    await bounded((async () => {
      while ((await admin.hget(`ebb:{${id}}:meta`, 'state')) !== 'ended') await sleep(10);
    })(), `stream ${id}'s copy to end`);
    const entries = await admin.xrange(`ebb:{${id}}:events`, '-', '+');
    assert.equal(entries.length, 1, `the copy's entries: ${JSON.stringify(entries.map(([, f]) => f.filter((_, i) => i % 2 === 0)))}`);
    const fields = entries[0]![1];
    assert.ok(fields.includes('end'), 'the one entry is the end');
    assert.equal(fields[fields.indexOf('e') + 1], body, 'it holds every event the client got');
    assert.equal((await scriptsRun(admin)) - scripts, 1, 'the store ran one script for it');
    const res = await fetch(`${b.url}/v1/chat/completions/${id}?stream=true`);
    assert.equal(res.status, 200);
    assert.equal(await res.text(), body, 'resumed from the start at another frontend: byte for byte');
  });

  it('a stream past --stream-store-max-response-bytes is no longer resumable elsewhere: a 404 saying so, not an empty 200', async () => {
    const { id, body } = await stream(await post(a, 2000));
    assert.ok(body.length > 20_000, 'the stream outgrew the bound');
    const res = await call('GET', `${b.url}/v1/chat/completions/${id}?stream=true&starting_after=3`);
    assert.equal(res.status, 404);
    assert.equal(res.body.error.code, 'response_expired');
  });

  it('a frozen Redis: the store counts as down within seconds, and a resume that needs it is refused (503), not held; back once Redis answers', async () => {
    const mark = b.mark();
    redis.freeze();
    try {
      await b.waitForEvent('stream_store_unavailable', () => true, { after: mark });
      assert.equal(await metricValue(b.url, 'ebb_frontend_stream_store_up'), 0);
      const res = await bounded(call('GET', `${b.url}/v1/chat/completions/chatcmpl-0123456789abcdef?stream=true`), 'a resume while Redis is frozen to be answered');
      assert.equal(res.status, 503);
      assert.equal(res.body.error.code, 'stream_store_unavailable');
    } finally {
      redis.thaw();
    }
    await b.waitForEvent('stream_store_available', () => true, { after: mark });
    assert.equal(await metricValue(b.url, 'ebb_frontend_stream_store_up'), 1);
  });

  it('writes refused at maxmemory are no outage: the store stays up, streams complete', async () => {
    const mark = a.mark();
    await admin.config('SET', 'maxmemory', '1');
    try {
      const { body } = await stream(await post(a, 20));
      assert.ok(body.endsWith('data: [DONE]\n\n'));
      assert.equal(await metricValue(a.url, 'ebb_frontend_stream_store_up'), 1);
      assert.ok(!a.logs.slice(mark).some((l) => l.event === 'stream_store_unavailable'), 'no outage was logged');
    } finally {
      await admin.config('SET', 'maxmemory', '0');
    }
  });

  it('a password from --stream-store-password-file: streams shared across frontends, the password in no log line; one in the URL is logged redacted; a normal stop logs no outage', async () => {
    const locked = await startRedis(['--requirepass', 's3cret-pw']);
    const dir = mkdtempSync(join(tmpdir(), 'ebb-redis-pw-'));
    writeFileSync(join(dir, 'pw'), 's3cret-pw\n', { mode: 0o600 });
    try {
      const [c, d] = await Promise.all([
        startFrontend(discovery, ['--stream-store', locked.url, '--stream-store-password-file', join(dir, 'pw')]),
        startFrontend(discovery, ['--stream-store', locked.url.replace('redis://', 'redis://:s3cret-pw@')]),
      ]);
      started.push(c, d);
      await Promise.all([c, d].map((f) => frontendSeesWorkers(f, 1)));
      const { id, body } = await stream(await post(c, 10));
      const elsewhere = await fetch(`${d.url}/v1/chat/completions/${id}?stream=true`);
      assert.equal(await elsewhere.text(), body, 'resumed whole at the other frontend');
      await c.stop();
      await d.stop();
      for (const f of [c, d]) {
        const text = [...f.logs.map((l) => JSON.stringify(l)), ...f.stderr].join('\n');
        assert.ok(!text.includes('s3cret-pw'), `${f.label}: the password appears in no log line`);
        assert.ok(!f.logs.some((l) => l.event === 'stream_store_unavailable'), `${f.label}: its stop is no outage`);
      }
      assert.ok(d.logs.some((l) => l.event === 'stream_store_connected' && String(l.url).includes(':***@')), 'the URL is logged with its password hidden');
    } finally {
      await locked.stop();
    }
  });
});
