import { once } from 'node:events';
import { createServer, request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
/**
 * Real KV movement between llama-cpp workers, one fleet for every assertion (llama-cpp processes
 * are slow to start): disaggregated prefill/decode answers equal aggregated ones and report the
 * prompt tokens the decode worker did not evaluate; a foreign state is refused and the request
 * still completes; a prefill worker drains only once its transfers are pulled; a drain with a
 * deadline hands running streams off with their KV (guided decoding included) and the texts equal
 * an undisturbed run.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { call, openLineStream } from './helpers/http.js';
import { writeTinyLlamaGguf } from './helpers/gguf.js';
import { metricValue, spawnEbb, startFrontend, tempDiscoveryUrl, workerReady, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { streamCompletion, type StreamOutcome } from './helpers/sse.js';

const modelPath = writeTinyLlamaGguf();
const foreignPath = writeTinyLlamaGguf({ seed: 7 });
const COMMON = ['--threads', '1', '--gpu', 'off', '--context-size', '2048'];
/** Aggregated model "tiny" (A, B), disaggregated "split" (P, D): the same GGUF file. */
const AGG = 'tiny';
const SPLIT = 'split';
const STREAMS = 3;
const TOKENS = 400;
const PROMPT = 'hello world, tell me about the tides and the moon and the sea';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

async function llamaWorker(discovery: string, model: string, args: string[], path = modelPath): Promise<WorkerHandle> {
  const p = spawnEbb(['worker', '--port', '0', '--system-port', '0', '--discovery', discovery, '--engine', 'llama-cpp', '--model-path', path, '--model', model, ...COMMON, ...args], 'worker');
  started.push(p);
  return workerReady(p);
}

const isOk = (r: { status: number }) => r.status === 200 || r.status === 202;

/** The NDJSON answer of a worker's /generate: text and terminal line. */
async function generate(w: WorkerHandle, body: Record<string, unknown>): Promise<{ text: string; last: any }> {
  const stream = await openLineStream(`${w.requestUrl}/generate`, body);
  const lines = (await stream.done).map((l) => JSON.parse(l));
  return { text: lines.filter((l) => typeof l.text === 'string').map((l) => l.text).join(''), last: lines.at(-1) };
}

async function prefillOn(p: WorkerHandle, body: Record<string, unknown>) {
  const res = await call('POST', `${p.requestUrl}/prefill`, body);
  assert.equal(res.status, 200, JSON.stringify(res.body));
  // What the frontend hands the decode worker: the transfer, and what the prefill found cached.
  const { transfer_id, source_url, worker_id, cached_tokens } = res.body as { transfer_id: string; source_url: string; worker_id: string; cached_tokens: number };
  return { transfer_id, source_url, worker_id, cached_tokens };
}

describe('llama-cpp: KV moves between workers', () => {
  let discovery: string;
  let a: WorkerHandle, b: WorkerHandle, p: WorkerHandle, d: WorkerHandle, foreign: WorkerHandle;
  let frontend: FrontendHandle;
  before(async () => {
    discovery = tempDiscoveryUrl();
    const invariant = ['--parallel', String(STREAMS), '--batch-invariant'];
    // One after the other: five model loads at once outrun the start-up bound on a busy machine.
    a = await llamaWorker(discovery, AGG, invariant);
    b = await llamaWorker(discovery, AGG, invariant);
    p = await llamaWorker(discovery, SPLIT, ['--mode', 'prefill']);
    d = await llamaWorker(discovery, SPLIT, ['--mode', 'decode']);
    // Another model file under another name: its states must never load into "split".
    foreign = await llamaWorker(discovery, 'foreign', ['--mode', 'prefill'], foreignPath);
    frontend = await startFrontend(discovery);
    started.push(frontend);
    await frontend.waitForLog((l) => l.event === 'discovery_reset' && (l.workers as string[]).length === 5, 'the frontend sees all five workers');
  });

  const body = (model: string, extra: Record<string, unknown> = {}) => ({ model, prompt: PROMPT, temperature: 0, max_tokens: 30, ...extra });

  it('disaggregated answers equal aggregated ones; cached_tokens is what was cached before the request came, not the KV it brought', async () => {
    const aggregated = await generate(a, body(AGG));
    const kv = await prefillOn(p, body(SPLIT));
    const split = await generate(d, { ...body(SPLIT), kv_transfer: kv });
    assert.equal(split.text, aggregated.text);
    assert.equal(split.last.usage.prompt_tokens, aggregated.last.usage.prompt_tokens);
    assert.equal(split.last.usage.prompt_tokens_details.cached_tokens, 0, 'cold: the prefill worker computed the whole prompt for this request (its KV came to the decode worker, but nothing was cached)');
    assert.equal(aggregated.last.usage.prompt_tokens_details.cached_tokens, 0, 'no KV pulled: every prompt token evaluated');

    // Through the frontend: chat requests split between P and D answer as A does.
    const ask = (model: string) => streamCompletion(frontend.url, { model, messages: [{ role: 'user', content: 'split me' }], max_tokens: 40, temperature: 0 });
    const [viaSplit, viaAgg] = [await ask(SPLIT), await ask(AGG)];
    assert.equal(viaSplit.error, undefined);
    assert.equal(viaSplit.text, viaAgg.text);
    assert.equal(await metricValue(d.systemUrl, 'ebb_kv_state_pulls_total', 'outcome="pulled"'), 2);
    assert.equal(await metricValue(p.systemUrl, 'ebb_kv_pending_transfers'), 0);
    assert.equal(await metricValue(p.systemUrl, 'ebb_kv_state_bytes'), 0, 'pulled states are removed on the prefill side');
    assert.equal(await metricValue(d.systemUrl, 'ebb_kv_state_bytes'), 0, 'loaded states are removed on the decode side');
  });

  it('a foreign state is refused, released at its source, and the request still completes', async () => {
    // A prompt the decode worker has not seen: its own prefix cache (kept sequences) has none of it,
    // so every token it did not evaluate would have come from the refused state.
    const fresh = { prompt: 'far from here, tell me about the tides and the moon and the sea' };
    const aggregated = await generate(a, body(AGG, fresh));
    const kv = await prefillOn(foreign, body('foreign', fresh));
    const split = await generate(d, { ...body(SPLIT, fresh), kv_transfer: kv });
    assert.equal(split.text, aggregated.text, 'evaluated on the decode worker instead');
    assert.equal(split.last.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(await metricValue(d.systemUrl, 'ebb_kv_state_pulls_total', 'outcome="refused"'), 1);
    assert.equal(await metricValue(foreign.systemUrl, 'ebb_kv_pending_transfers'), 0, 'the refusing peer still released it');
    await d.waitForLog((l) => l.event === 'kv_state_not_used' && /another model/.test(String(l.err)), 'the decode worker says why');
  });

  it('a draining prefill worker stays draining until its transfers are pulled', async () => {
    const transfers = [await prefillOn(p, body(SPLIT)), await prefillOn(p, body(SPLIT, { prompt: `${PROMPT} again` }))];
    const drain = await call('POST', `${p.systemUrl}/engine/drain`);
    assert.equal(drain.status, 202);
    assert.deepEqual(drain.body.waiting_for, ['2 pending KV transfers']);
    const pulled = await metricValue(d.systemUrl, 'ebb_kv_state_pulls_total', 'outcome="pulled"');
    await generate(d, { ...body(SPLIT), kv_transfer: transfers[0] });
    const mid = await call('GET', `${p.systemUrl}/engine/status`);
    assert.equal(mid.body.state, 'draining');
    assert.deepEqual(mid.body.waiting_for, ['1 pending KV transfer']);
    const second = await generate(d, { ...body(SPLIT, { prompt: `${PROMPT} again` }), kv_transfer: transfers[1] });
    assert.ok(second.last.usage.prompt_tokens_details !== undefined, JSON.stringify(second.last));
    assert.equal(await metricValue(d.systemUrl, 'ebb_kv_state_pulls_total', 'outcome="pulled"'), pulled + 2, 'the states pulled from a draining worker were used');
    await p.waitForEvent('state_changed', (l) => l.to === 'drained');
    assert.ok(isOk(await call('POST', `${p.systemUrl}/engine/resume`)));
  });

  it('a prefill worker evaluates only what follows a prefix its sequences hold; that state still answers as aggregated', async () => {
    const long = { prompt: 'the harbor light turns slowly over the water and the boats come home at dusk. '.repeat(4) };
    const hits = async () => (await call('GET', `${p.systemUrl}/engine/status`)).body.kv_cache.prompt_tokens_hit as number;
    const aggregated = await generate(a, body(AGG, long));
    const cold = await prefillOn(p, body(SPLIT, long));
    const before = await hits();
    const warm = await prefillOn(p, body(SPLIT, long));
    assert.equal(await hits(), before + aggregated.last.usage.prompt_tokens - 1, 'all but the last prompt token were in the prefill worker\'s cache');
    const fromWarm = await generate(d, { ...body(SPLIT, long), kv_transfer: warm });
    assert.equal(fromWarm.text, aggregated.text);
    assert.equal(fromWarm.last.usage.prompt_tokens_details.cached_tokens, aggregated.last.usage.prompt_tokens - 1, "warm: all but the last prompt token were in the prefill worker's cache before this request");
    // The cold state is not pulled: released, so later drains of P do not wait for it.
    assert.equal((await call('DELETE', `${cold.source_url}/kv/${cold.transfer_id}`)).status, 204);
  });

  it('with its only prefill worker drained, the decode worker evaluates the prompt itself and answers as aggregated', async () => {
    const left = frontend.mark();
    const drain = await call('POST', `${p.systemUrl}/engine/drain`);
    assert.ok(isOk(drain), JSON.stringify(drain.body));
    await frontend.waitForLog((l) => l.event === 'worker_removed' && l.worker_id === p.workerId, 'P left the routing view', { after: left });
    const ask = (model: string) => streamCompletion(frontend.url, { model, messages: [{ role: 'user', content: 'no prefill worker' }], max_tokens: 20, temperature: 0 });
    const pulled = await metricValue(d.systemUrl, 'ebb_kv_state_pulls_total', 'outcome="pulled"');
    const [viaDecode, viaAgg] = [await ask(SPLIT), await ask(AGG)];
    assert.equal(viaDecode.status, 200, viaDecode.error);
    assert.equal(viaDecode.workerId, d.workerId);
    assert.equal(viaDecode.text, viaAgg.text);
    assert.equal(await metricValue(d.systemUrl, 'ebb_kv_state_pulls_total', 'outcome="pulled"'), pulled, 'nothing was pulled');
    if (drain.body.state !== 'drained') await p.waitForEvent('state_changed', (l) => l.to === 'drained');
    assert.ok(isOk(await call('POST', `${p.systemUrl}/engine/resume`)));
  });

  it('a drain with deadline hands running streams off with their KV: texts equal an undisturbed run, guided decoding included', async () => {
    const waitRouted = (w: WorkerHandle, cursor: { after: number }) =>
      frontend.waitForLog(
        (l) => (l.event === 'discovery_reset' && (l.workers as string[]).includes(w.workerId)) || (l.event === 'worker_added' && l.worker_id === w.workerId),
        `the frontend routes to ${w.workerId}`,
        cursor,
      );
    // Stream 0 is guided (a schema long enough to outlast the move): its grammar resumes from the delivered tokens on B.
    const schema = { type: 'object', properties: { words: { type: 'array', items: { type: 'string' }, minItems: 200 } }, required: ['words'] };
    const ask = (i: number, onToken?: (n: number) => void): Promise<StreamOutcome> =>
      streamCompletion(
        frontend.url,
        {
          model: AGG,
          messages: [{ role: 'user', content: `question ${i}: the tides, number ${i * 7}` }],
          max_tokens: TOKENS,
          temperature: 0,
          stream_options: { include_usage: true },
          ...(i === 0 ? { response_format: { type: 'json_schema', json_schema: { name: 'words', schema } } } : {}),
        },
        undefined,
        onToken,
      );

    // Undisturbed: on A alone.
    const gone = frontend.mark();
    assert.ok(isOk(await call('POST', `${b.systemUrl}/engine/drain`)));
    await frontend.waitForLog((l) => l.event === 'worker_removed' && l.worker_id === b.workerId, 'B left the routing view', { after: gone });
    const undisturbed = await Promise.all(Array.from({ length: STREAMS }, (_, i) => ask(i)));
    for (const r of undisturbed) assert.equal(r.usage?.completion_tokens, TOKENS, r.error);
    assert.match(undisturbed[0]!.text, /^\{"words":\["/, 'the guided answer follows its schema');

    // Moved: all start on A; once the guided stream has streamed, B comes back and A's drain deadline
    // hands over what A still runs. The trigger is the guided stream's own progress: waiting for all
    // three let it finish on a loaded machine (the streams do not progress evenly on A) before the drain.
    let progressed!: () => void;
    const guidedProgressed = new Promise<void>((resolve) => (progressed = resolve));
    const moved = Array.from({ length: STREAMS }, (_, i) => ask(i, i === 0 ? (n) => n === 10 && progressed() : undefined));
    await guidedProgressed;
    // A is held still (SIGSTOP) until its drain is on its socket: on a loaded machine the streams
    // would otherwise finish while B comes back, and nothing would be left to hand off.
    process.kill(a.pid, 'SIGSTOP');
    let drained: { status: Promise<number> } | undefined;
    let pulledBefore: number;
    try {
      const back = frontend.mark();
      assert.ok(isOk(await call('POST', `${b.systemUrl}/engine/resume`)));
      await waitRouted(b, { after: back });
      pulledBefore = await metricValue(b.systemUrl, 'ebb_kv_state_pulls_total', 'outcome="pulled"');
      drained = await drainWritten(a.systemUrl, { deadline_ms: 0 });
    } finally {
      process.kill(a.pid, 'SIGCONT');
    }
    const status = await drained?.status;
    assert.ok(status !== undefined && status >= 200 && status < 300, `drain answered ${status}`);
    const results = await Promise.all(moved);

    // What A still ran at its deadline is handed off: the guided stream surely (10 of its 400 tokens
    // were out when A was stopped); the others may have finished on A by then, or not have started
    // (handed off before their first token, they start afresh elsewhere: no migration, no KV). B's
    // pulls count the streams that moved with their KV; their log lines may still be on their way.
    const handedOff = (await call('GET', `${a.systemUrl}/engine/status`)).body.handed_off as number;
    const pulled = (await metricValue(b.systemUrl, 'ebb_kv_state_pulls_total', 'outcome="pulled"')) - pulledBefore;
    const seen = () => JSON.stringify({ frontend: frontend.logs.filter((l) => /migrat|hand/.test(String(l.event))), streams: results.map((r) => ({ error: r.error, done: r.done, usage: r.usage })) });
    assert.ok(pulled >= 1 && pulled <= handedOff, `A handed ${handedOff} stream(s) off, B loaded ${pulled} KV state(s); ${seen()}`);
    const migrations = await frontend.waitForCount((l) => l.event === 'stream_migrated' && l.from_worker === a.workerId && l.to_worker === b.workerId, pulled, 'stream_migrated from A to B');
    assert.equal(migrations.length, pulled, `every stream that moved mid-stream moved with its KV; ${seen()}`);
    // The guided stream is the case's point: it must have been one of them (its grammar resumed on B).
    assert.ok(migrations.some((l) => l.request_id === results[0]!.chunkIds[0]), `the guided stream ${results[0]!.chunkIds[0]} was handed off from A to B; ${seen()}`);
    for (const [i, r] of results.entries()) {
      assert.equal(r.error, undefined, `stream ${i}: ${r.error}`);
      assert.equal(r.usage?.completion_tokens, TOKENS);
      assert.equal(r.text, undisturbed[i]!.text, `stream ${i} equals its undisturbed run`);
    }
    // A reaches drained once B has confirmed every state; nothing stays on disk on either side.
    await a.waitForEvent('state_changed', (l) => l.to === 'drained');
    assert.equal(await metricValue(a.systemUrl, 'ebb_kv_pending_transfers'), 0);
    assert.equal(await metricValue(a.systemUrl, 'ebb_kv_state_bytes'), 0);
    assert.equal(await metricValue(b.systemUrl, 'ebb_kv_state_bytes'), 0);
  });

  it('a hand-off whose KV is gone continues by re-evaluation; a source outside discovery is never called', async () => {
    const whole = await generate(b, body(AGG, { max_tokens: 20 }));
    const first = await openLineStream(`${b.requestUrl}/generate`, body(AGG, { max_tokens: 8 }));
    const pieces = (await first.done).map((l) => JSON.parse(l)).filter((l) => typeof l.text === 'string');
    const continuation = { text: pieces.map((l) => l.text).join(''), completion_tokens: 8, token_ids: pieces.flatMap((l) => l.token_ids) };
    const gone = { transfer_id: 'kv-gone', source_url: a.requestUrl, worker_id: a.workerId };
    const before = await metricValue(b.systemUrl, 'ebb_kv_state_pulls_total', 'outcome="unavailable"');
    const rest = await generate(b, { ...body(AGG, { max_tokens: 12 }), continuation, handoff_kv: gone });
    assert.equal(continuation.text + rest.text, whole.text, 'the stream goes on as if undisturbed');
    assert.equal(await metricValue(b.systemUrl, 'ebb_kv_state_pulls_total', 'outcome="unavailable"'), before + 1);
    // A source B has not seen registered is never called (neither pulled from nor told to free its
    // state), and the stream is not refused for it: it goes on by re-evaluation.
    let strangerCalls = 0;
    const strangerServer = createServer((_req, res) => {
      strangerCalls++;
      res.writeHead(404).end();
    });
    await new Promise<void>((resolve) => strangerServer.listen(0, '127.0.0.1', resolve));
    try {
      const strangerUrl = `http://127.0.0.1:${(strangerServer.address() as AddressInfo).port}`;
      const unseen = await generate(b, { ...body(AGG, { max_tokens: 12 }), continuation, handoff_kv: { ...gone, source_url: strangerUrl } });
      assert.equal(continuation.text + unseen.text, whole.text, 'the stream goes on as if undisturbed');
      assert.equal(strangerCalls, 0, 'the unseen source was not called');
    } finally {
      strangerServer.close();
    }
  });

  it('a hand-off nobody continues releases its KV: the draining worker does not wait for the TTL', async () => {
    // B out, A back; a frontend that never migrates: A's hand-off ends the stream with migration_failed.
    const bOut = { after: b.mark() };
    assert.ok(isOk(await call('POST', `${b.systemUrl}/engine/drain`)));
    await b.waitForEvent('state_changed', (l) => l.to === 'drained', bOut);
    assert.ok(isOk(await call('POST', `${a.systemUrl}/engine/resume`)));
    const noMoves = await startFrontend(discovery, ['--migration-limit', '0']);
    started.push(noMoves);
    await noMoves.waitForLog((l) => l.event === 'discovery_reset' && (l.workers as string[]).includes(a.workerId), 'the frontend routes to A');
    let progressed!: () => void;
    const streaming = new Promise<void>((resolve) => (progressed = resolve));
    const outcome = streamCompletion(noMoves.url, { model: AGG, messages: [{ role: 'user', content: 'a long one' }], max_tokens: TOKENS, temperature: 0 }, undefined, (n) => n === 10 && progressed());
    await streaming;
    const cursor = { after: a.mark() };
    assert.ok(isOk(await call('POST', `${a.systemUrl}/engine/drain`, { deadline_ms: 0 })));
    const r = await outcome;
    assert.equal(r.errorCode, 'migration_failed', r.error);
    // The state's TTL (30 s) is longer than this wait's bound: drained here means it was released.
    await a.waitForEvent('state_changed', (l) => l.to === 'drained', cursor);
    assert.equal(await metricValue(a.systemUrl, 'ebb_kv_state_bytes'), 0);
  });
});

/** POST /engine/drain; resolves once the request is flushed to the kernel, with the answer's status to come. */
async function drainWritten(systemUrl: string, body: unknown): Promise<{ status: Promise<number> }> {
  const req = httpRequest(`${systemUrl}/engine/drain`, { method: 'POST', headers: { 'content-type': 'application/json' } });
  const status = new Promise<number>((resolve, reject) => {
    req.on('response', (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    });
    req.on('error', reject);
  });
  req.end(JSON.stringify(body));
  await once(req, 'finish');
  return { status };
}
