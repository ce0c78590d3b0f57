import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import OpenAI from 'openai';
import { call, fakeWorker, injectRecord, openLineStream } from './helpers/http.js';
import { bounded, metricValue, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type WorkerHandle } from './helpers/processes.js';
import { streamCompletion } from './helpers/sse.js';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

async function worker(discovery: string, mode: 'prefill' | 'decode' | 'aggregated', args: string[] = [], env: NodeJS.ProcessEnv = {}): Promise<WorkerHandle> {
  const w = await startWorker(['--discovery', discovery, '--model', 'm1', '--mode', mode, ...args], env);
  started.push(w);
  return w;
}

/** Plays the frontend's part by hand: prefill on `p`, keeping the transfer pending. */
async function prefill(p: WorkerHandle, prompt = 'a prompt of several words for the cache') {
  const res = await call('POST', `${p.requestUrl}/prefill`, { model: 'm1', prompt, max_tokens: 5 });
  assert.equal(res.status, 200, JSON.stringify(res.body));
  assert.equal(res.body.source_url, p.requestUrl);
  assert.ok(res.body.kv_bytes > 0);
  assert.equal(res.body.worker_id, p.workerId);
  // What a decode worker is handed: the transfer reference, nothing else.
  const { transfer_id, source_url, worker_id } = res.body as { transfer_id: string; source_url: string; worker_id: string };
  return { transfer_id, source_url, worker_id };
}

describe('disaggregated prefill/decode', () => {
  it("streams end to end through the frontend with the openai SDK; cached_tokens is what the prefill worker had cached: 0 cold, the prompt's whole blocks warm", async () => {
    const discovery = tempDiscoveryUrl();
    const p = await worker(discovery, 'prefill', ['--mocker-itl-ms', '1']);
    await worker(discovery, 'decode', ['--mocker-itl-ms', '1']);
    await worker(discovery, 'decode', ['--mocker-itl-ms', '1']);
    const frontend = await startFrontend(discovery);
    started.push(frontend);
    const client = new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'unused' });
    const stream = await client.chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'split me' }], max_tokens: 9, stream: true });
    let pieces = 0;
    for await (const chunk of stream) if (chunk.choices[0]?.delta?.content) pieces++;
    assert.equal(pieces, 9);
    const whole = await client.completions.create({ model: 'm1', prompt: 'split me too', max_tokens: 4 });
    assert.equal(whole.usage?.completion_tokens, 4);
    assert.equal(await metricValue(p.systemUrl, 'ebb_kv_transfer_duration_seconds_count'), 2, 'both requests went through a KV transfer');
    assert.equal(await metricValue(p.systemUrl, 'ebb_kv_pending_transfers'), 0);
    // 40 tokens: with 16-token blocks, 2 whole blocks can be found cached (the last token is always computed).
    const prompt = Array.from({ length: 40 }, (_, i) => `tide${i}`).join(' ');
    const cold = await client.completions.create({ model: 'm1', prompt, max_tokens: 2 });
    const warm = await client.completions.create({ model: 'm1', prompt, max_tokens: 2 });
    const cachedOf = (r: OpenAI.Completion) => (r.usage as OpenAI.CompletionUsage & { prompt_tokens_details?: { cached_tokens?: number } }).prompt_tokens_details?.cached_tokens;
    assert.equal(cold.usage?.prompt_tokens, 40);
    assert.equal(cachedOf(cold), 0, 'cold: nothing was cached before it, though its KV came to the decode worker whole');
    assert.equal(cachedOf(warm), 32, "warm: the whole blocks found in the prefill worker's cache");
  });

  it('keeps a draining prefill worker draining while transfers are pending, then drains when decode pulls them', async () => {
    const discovery = tempDiscoveryUrl();
    const p = await worker(discovery, 'prefill');
    const d = await worker(discovery, 'decode', ['--mocker-itl-ms', '1']);
    const transfers = [await prefill(p), await prefill(p)];
    const drain = await call('POST', `${p.systemUrl}/engine/drain`);
    assert.equal(drain.status, 202);
    assert.equal(drain.body.state, 'draining');
    assert.equal(drain.body.inflight_requests, 0);
    assert.equal(drain.body.engine.kv_transfers_pending, 2);
    assert.deepEqual(drain.body.waiting_for, ['2 pending KV transfers']);
    const refused = await call('POST', `${p.requestUrl}/prefill`, { model: 'm1', prompt: 'late' });
    assert.equal(refused.status, 503, 'no new prefill while draining');

    const first = await openLineStream(`${d.requestUrl}/generate`, { model: 'm1', prompt: 'x', max_tokens: 3, kv_transfer: transfers[0] });
    assert.equal((await first.done).length, 4);
    const mid = await call('GET', `${p.systemUrl}/engine/status`);
    assert.equal(mid.body.state, 'draining');
    assert.deepEqual(mid.body.waiting_for, ['1 pending KV transfer']);
    const second = await openLineStream(`${d.requestUrl}/generate`, { model: 'm1', prompt: 'x', max_tokens: 3, kv_transfer: transfers[1] });
    assert.equal((await second.done).length, 4);
    await p.waitForEvent('state_changed', (l) => l.to === 'drained');
    assert.equal((await call('GET', `${p.systemUrl}/engine/status`)).body.state, 'drained');
  });

  it('releases and counts a transfer whose decode peer never came', async () => {
    const discovery = tempDiscoveryUrl();
    // Long enough that the drain call comes before the expiry on a loaded machine.
    const p = await worker(discovery, 'prefill', ['--kv-transfer-ttl-ms', '3000']);
    const t = await prefill(p);
    const drain = await call('POST', `${p.systemUrl}/engine/drain`);
    assert.equal(drain.body.state, 'draining');
    const expired = await p.waitForEvent('kv_transfer_expired');
    assert.equal(expired.transfer_id, t.transfer_id);
    await p.waitForEvent('state_changed', (l) => l.to === 'drained');
    assert.equal(await metricValue(p.systemUrl, 'ebb_kv_transfers_expired_total'), 1);
    assert.equal((await call('GET', `${p.requestUrl}/kv/${t.transfer_id}`)).status, 404, 'an expired transfer is gone');
  });

  it('never reports drained for a prefill engine that cannot report transfers, even with nothing in flight', async () => {
    const discovery = tempDiscoveryUrl();
    const p = await worker(discovery, 'prefill', ['--mocker-kv-reporting', 'unsupported', '--kv-transfer-ttl-ms', '300', '--drain-timeout-ms', '300']);
    await prefill(p);
    const drain = await call('POST', `${p.systemUrl}/engine/drain`);
    assert.equal(drain.status, 202);
    assert.equal(drain.body.state, 'draining');
    assert.equal(drain.body.inflight_requests, 0);
    assert.match(drain.body.waiting_for.join(), /cannot report pending KV transfers/);
    // Later events that re-ask the engine (a transfer expiring) still cannot drain it, and neither
    // can SIGTERM's deadline: the whole life of the process is checked, not one instant.
    await p.waitForEvent('kv_transfer_expired');
    assert.equal((await call('GET', `${p.systemUrl}/engine/status`)).body.state, 'draining');
    p.signal('SIGTERM');
    assert.equal(await p.exitCode(), 1, 'a shutdown that could not confirm idleness is not clean');
    const waited = await p.waitForEvent('shutdown_stage', (l) => l.stage === 'wait_inflight');
    assert.equal(waited.outcome, 'unsupported');
    assert.ok(!p.logs.some((l) => l.to === 'drained'), 'never a false drained');
  });

  it('pulls KV only on decode workers and only from a registered prefill worker (no SSRF)', async () => {
    const hits: string[] = [];
    const fake = createServer((req, res) => {
      hits.push(`${req.method} ${req.url}`);
      res.end('x');
    });
    fake.listen(0, '127.0.0.1');
    await once(fake, 'listening');
    const fakeUrl = `http://127.0.0.1:${(fake.address() as AddressInfo).port}`;
    try {
      const discovery = tempDiscoveryUrl();
      const p = await worker(discovery, 'prefill');
      const d = await worker(discovery, 'decode');
      const agg = await worker(discovery, 'aggregated');
      const forged = { transfer_id: 'kv-1', source_url: fakeUrl, worker_id: p.workerId };
      const onAggregated = await call('POST', `${agg.requestUrl}/generate`, { model: 'm1', prompt: 'x', kv_transfer: forged });
      assert.equal(onAggregated.status, 400);
      assert.equal(onAggregated.body.error.code, 'invalid_request');
      const wrongUrl = await call('POST', `${d.requestUrl}/generate`, { model: 'm1', prompt: 'x', kv_transfer: forged });
      assert.equal(wrongUrl.status, 403);
      assert.equal(wrongUrl.body.error.code, 'forbidden');
      const unknownWorker = await call('POST', `${d.requestUrl}/generate`, { model: 'm1', prompt: 'x', kv_transfer: { ...forged, worker_id: 'w-nobody' } });
      assert.equal(unknownWorker.status, 403);
      const onPrefill = await call('POST', `${p.requestUrl}/generate`, { model: 'm1', prompt: 'x', kv_transfer: forged });
      assert.equal(onPrefill.status, 400);
      assert.deepEqual(hits, [], 'no worker fetched the forged URL');
      // The real reference still works, and a failed pull does not echo the remote answer.
      const real = await prefill(p);
      const ok = await openLineStream(`${d.requestUrl}/generate`, { model: 'm1', prompt: 'x', max_tokens: 2, kv_transfer: real });
      assert.equal((await ok.done).length, 3);
      const again = await call('POST', `${d.requestUrl}/generate`, { model: 'm1', prompt: 'x', max_tokens: 2, kv_transfer: real, stream: false });
      assert.equal(again.status, 502);
      assert.equal(again.body.error.code, 'kv_transfer_failed');
      assert.doesNotMatch(again.body.error.message, /HTTP \d+/);
    } finally {
      fake.close();
    }
  });

  it('with a request-plane token, decode pulls KV with it and nobody pulls without it', async () => {
    const env = { EBB_REQUEST_TOKEN: 'fleet-secret' };
    const auth = { authorization: 'Bearer fleet-secret' };
    const discovery = tempDiscoveryUrl();
    const p = await worker(discovery, 'prefill', [], env);
    const d = await worker(discovery, 'decode', ['--mocker-itl-ms', '1'], env);
    const res = await call('POST', `${p.requestUrl}/prefill`, { model: 'm1', prompt: 'a b c', max_tokens: 2 }, auth);
    assert.equal(res.status, 200);
    const { transfer_id, source_url, worker_id } = res.body;
    assert.equal((await call('GET', `${p.requestUrl}/kv/${transfer_id}`)).status, 401, 'the KV is not for anyone who asks');
    const out = await call('POST', `${d.requestUrl}/generate`, { model: 'm1', prompt: 'a b c', max_tokens: 2, stream: false, kv_transfer: { transfer_id, source_url, worker_id } }, auth);
    assert.equal(out.status, 200, JSON.stringify(out.body));
    assert.equal(out.body.usage.completion_tokens, 2);
    assert.equal(await metricValue(p.systemUrl, 'ebb_kv_pending_transfers'), 0);
  });

  it('redoes prefill when the decode worker that pulled the KV dies before its first token', async () => {
    const discovery = tempDiscoveryUrl();
    await worker(discovery, 'prefill');
    const victim = await startWorker(['--discovery', discovery, '--model', 'm1', '--mode', 'decode', '--mocker-itl-ms', '600000'], { EBB_LOG_LEVEL: 'debug' });
    started.push(victim);
    const frontend = await startFrontend(discovery);
    started.push(frontend);
    const request = streamCompletion(frontend.url, { model: 'm1', max_tokens: 5 });
    await victim.waitForEvent('kv_pulled');
    const healthy = await worker(discovery, 'decode', ['--mocker-itl-ms', '1']);
    await frontend.waitForEvent('worker_added', (l) => l.worker_id === healthy.workerId);
    victim.signal('SIGKILL');
    const result = await request;
    assert.equal(result.status, 200, result.error);
    assert.equal(result.tokens, 5, result.error);
    assert.equal(result.done, true);
    assert.equal(result.workerId, healthy.workerId);
  });

  it('drains a decode worker mid-stream: every stream completes', async () => {
    const discovery = tempDiscoveryUrl();
    await worker(discovery, 'prefill');
    const d1 = await worker(discovery, 'decode', ['--mocker-itl-ms', '20']);
    await worker(discovery, 'decode', ['--mocker-itl-ms', '20']);
    const frontend = await startFrontend(discovery);
    started.push(frontend);
    let firsts = 0;
    let bothStarted!: () => void;
    const ready = new Promise<void>((r) => (bothStarted = r));
    // Long enough (3 s) to still run on both decode workers when the drain comes, on a loaded machine too.
    const streams = Array.from({ length: 6 }, (_, i) =>
      streamCompletion(frontend.url, { model: 'm1', max_tokens: 150, seed: i }, () => {
        if (++firsts === 6) bothStarted();
      }),
    );
    await ready;
    const drain = await call('POST', `${d1.systemUrl}/engine/drain`);
    assert.equal(drain.body.state, 'draining');
    assert.ok(drain.body.inflight_requests > 0, 'the decode worker had streams in flight');
    const results = await Promise.all(streams);
    for (const r of results) {
      assert.equal(r.tokens, 150, r.error);
      assert.equal(r.done, true);
    }
    await d1.waitForEvent('state_changed', (l) => l.to === 'drained');
  });
  it('answers headers before pulling the KV: a transfer slower than the frontend\'s patience is no hung worker', async () => {
    const discovery = tempDiscoveryUrl();
    // A prefill source that holds its KV until told: the pull takes as long as the test wants.
    let pullSeen!: () => void;
    const pulling = new Promise<void>((resolve) => (pullSeen = resolve));
    let serveKv!: () => void;
    const kvReleased = new Promise<void>((resolve) => (serveKv = resolve));
    const source = await fakeWorker((req, res) => {
      if (req.method === 'DELETE') return void res.writeHead(204).end();
      pullSeen();
      void kvReleased.then(() => res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': '64' }).end(Buffer.alloc(64, 0x6b)));
    });
    try {
      injectRecord(discovery, { worker_id: 'w-slow-source', model: 'm1', mode: 'prefill', request_url: source.url, system_url: source.url });
      const d = await worker(discovery, 'decode', ['--mocker-itl-ms', '1']);
      const kv = { transfer_id: 'kv-slow', source_url: source.url, worker_id: 'w-slow-source' };
      const opening = openLineStream(`${d.requestUrl}/generate`, { model: 'm1', prompt: 'x', max_tokens: 3, kv_transfer: kv });
      await bounded(pulling, 'the decode worker to start pulling the KV');
      const s = await bounded(opening, 'the decode worker to answer headers while its KV pull is still in flight');
      assert.equal(s.status, 200);
      serveKv();
      const lines = (await s.done).map((l) => JSON.parse(l));
      assert.equal(lines.length, 4, JSON.stringify(lines));
      assert.equal(lines[3].done, true);
      assert.deepEqual(source.seen.map((r) => r.method), ['GET', 'DELETE'], 'pulled once, then released at the source');
    } finally {
      await source.close();
    }
  });

  it('a decode worker whose caller leaves while it pulls the KV frees the transfer at its source: nobody will pull it again', async () => {
    const discovery = tempDiscoveryUrl();
    // A prefill source whose payload never finishes: the pull is under way when the caller leaves.
    let pullSeen!: () => void;
    const pulling = new Promise<void>((resolve) => (pullSeen = resolve));
    let releaseSeen!: (url: string) => void;
    const released = new Promise<string>((resolve) => (releaseSeen = resolve));
    const source = await fakeWorker((req, res) => {
      if (req.method === 'DELETE') {
        releaseSeen(req.url);
        return void res.writeHead(204).end();
      }
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': '65536' });
      res.write(Buffer.alloc(1024, 0x6b));
      pullSeen();
    });
    try {
      injectRecord(discovery, { worker_id: 'w-stalled-source', model: 'm1', mode: 'prefill', request_url: source.url, system_url: source.url });
      const d = await worker(discovery, 'decode', ['--mocker-itl-ms', '1']);
      const kv = { transfer_id: 'kv-stalled', source_url: source.url, worker_id: 'w-stalled-source' };
      const s = await openLineStream(`${d.requestUrl}/generate`, { model: 'm1', prompt: 'x', max_tokens: 3, kv_transfer: kv });
      assert.equal(s.status, 200);
      await bounded(pulling, 'the decode worker to be pulling the KV');
      s.abort();
      assert.equal(await bounded(released, 'the source to be told to free the transfer'), '/kv/kv-stalled');
    } finally {
      await source.close();
    }
  });

  it('with no prefill worker serving (drained, then killed), decode workers evaluate the prompt themselves', async () => {
    const discovery = tempDiscoveryUrl();
    const p = await worker(discovery, 'prefill', ['--mocker-itl-ms', '1']);
    const d = await worker(discovery, 'decode', ['--mocker-itl-ms', '1']);
    const fe = await startFrontend(discovery);
    started.push(fe);
    const ask = async (what: string) => {
      const r = await streamCompletion(fe.url, { model: 'm1', max_tokens: 4 });
      assert.equal(r.status, 200, `${what}: ${r.error}`);
      assert.equal(r.tokens, 4, what);
      assert.equal(r.workerId, d.workerId, what);
    };
    await ask('both serving');
    // Drained: the prefill worker leaves discovery, only the decode worker is left.
    let mark = fe.mark();
    // 200: idle, drained at once.
    assert.equal((await call('POST', `${p.systemUrl}/engine/drain`)).status, 200);
    await fe.waitForEvent('worker_removed', (l) => l.worker_id === p.workerId, { after: mark });
    await ask('prefill worker drained');
    // Killed: still in discovery, unreachable.
    mark = fe.mark();
    assert.equal((await call('POST', `${p.systemUrl}/engine/resume`)).status, 200);
    await fe.waitForEvent('worker_added', (l) => l.worker_id === p.workerId, { after: mark });
    p.signal('SIGKILL');
    await p.exitCode();
    await ask('prefill worker killed');
  });
});
