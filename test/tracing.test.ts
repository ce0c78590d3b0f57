/**
 * OpenTelemetry traces end to end (issue 46): real frontends and workers export with the real SDK
 * to a test OTLP/HTTP receiver (test/helpers/otlp-receiver.ts). A stream that migrates after its
 * worker's SIGKILL, and one another frontend takes over after its frontend's SIGKILL, each come out
 * as ONE trace, the client's traceparent its root, every span's parent in it; an engine server
 * behind `--engine openai` gets the traceparent; with tracing off nothing is sent or answered.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { sseData } from '../src/common/sse-events.js';
import { startEngineSim, type EngineSim } from './helpers/engine-sim.js';
import { OtlpReceiver, type ReceivedSpan } from './helpers/otlp-receiver.js';
import { frontendSeesWorkers, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { redisSkipReason, startRedis, type RedisServer } from './helpers/redis.js';
import { streamCompletion } from './helpers/sse.js';

const started: EbbProcess[] = [];
let receiver: OtlpReceiver;
before(async () => {
  receiver = await OtlpReceiver.start();
});
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
  await receiver?.stop();
});

/** A client's own trace: a fresh trace id and span id, sampled. */
function clientTrace(): { traceId: string; spanId: string; traceparent: string } {
  const traceId = randomBytes(16).toString('hex');
  const spanId = randomBytes(8).toString('hex');
  return { traceId, spanId, traceparent: `00-${traceId}-${spanId}-01` };
}

/** The span id a traceparent names. */
const spanOf = (traceparent: string | null) => traceparent?.split('-')[2] ?? '';

/**
 * The trace is one tree under the client's span: every span has the client's trace id, and its
 * parent is the client's span or another span of the trace (none points at a span nobody exported).
 */
function assertParentLinked(spans: ReceivedSpan[], client: { traceId: string; spanId: string }): void {
  const ids = new Set(spans.map((s) => s.spanId));
  for (const s of spans) {
    assert.equal(s.traceId, client.traceId, `${s.name}: the client's trace`);
    assert.ok(s.parentSpanId === client.spanId || ids.has(s.parentSpanId), `${s.name} (${s.resource['service.name']} ${s.resource['service.instance.id']}): its parent ${s.parentSpanId} is in the trace or is the client's span; the trace: ${shape(spans)}`);
  }
}

/** The trace in one line, for an assertion's message: name[span<-parent process]. */
const shape = (spans: ReceivedSpan[]) => spans.map((s) => `${s.name}[${s.spanId}<-${s.parentSpanId} ${s.resource['service.instance.id']}]`).join(', ');

const byName = (spans: ReceivedSpan[], name: string) => spans.filter((s) => s.name === name);

describe('traces: a stream that migrates after its worker is SIGKILLed', () => {
  it('exports one trace: the client\'s traceparent its root, the frontend\'s request span, attempts on both workers, the migration with its reason and tokens, the second worker\'s span; the answer names the trace; the migration\'s log line its trace id', async () => {
    const env = receiver.env('http/protobuf');
    const discovery = tempDiscoveryUrl();
    const workers: WorkerHandle[] = [];
    for (let i = 0; i < 2; i++) {
      const w = await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '20', '--mocker-ttft-ms', '0'], env);
      started.push(w);
      workers.push(w);
    }
    const frontend = await startFrontend(discovery, [], env);
    started.push(frontend);
    await frontendSeesWorkers(frontend, 2);
    await frontend.waitForEvent('tracing_started');
    const client = clientTrace();
    let victim: WorkerHandle | undefined;
    const outcome = await streamCompletion(frontend.url, { model: 'm1', max_tokens: 60, seed: 3 }, undefined, (n, seen) => {
      if (n !== 10) return;
      victim = workers.find((w) => w.workerId === seen.workerId);
      victim?.signal('SIGKILL');
    }, { traceparent: client.traceparent });
    assert.equal(outcome.status, 200, outcome.error);
    assert.equal(outcome.error, undefined, 'the stream completed');
    assert.equal(outcome.tokens, 60);
    assert.ok(victim, 'the worker serving the stream was killed');
    const survivor = workers.find((w) => w !== victim)!;
    // Every span that ends in the frontend and the surviving worker: the request, both attempts, the migration, the stream, the second worker's.
    await receiver.waitFor((spans) => {
      const t = spans.filter((s) => s.traceId === client.traceId);
      return byName(t, 'ebb.migration').length === 1 && byName(t, 'ebb.stream').length === 1 && t.some((s) => s.name === 'POST /generate' && s.resource['service.instance.id'] === survivor.workerId);
    }, 'the migrated stream\'s trace');
    const spans = receiver.trace(client.traceId);
    assertParentLinked(spans, client);
    const [request] = byName(spans, 'POST /v1/chat/completions');
    assert.ok(request, `the frontend's request span: ${shape(spans)}`);
    assert.equal(request.parentSpanId, client.spanId, "the request span's parent is the client's span");
    assert.equal(request.kind, 2, 'a server span');
    assert.equal(request.attributes['gen_ai.request.model'], 'm1');
    assert.equal(request.resource['service.name'], 'ebb-frontend');
    const attempts = spans.filter((s) => s.name === 'ebb.attempt /generate');
    assert.deepEqual(new Set(attempts.map((a) => a.attributes['ebb.worker.id'])), new Set([victim.workerId, survivor.workerId]), 'an attempt on each worker');
    const [migration] = byName(spans, 'ebb.migration');
    assert.equal(migration!.parentSpanId, request.spanId, 'the migration is a child of the request');
    assert.equal(migration!.attributes['ebb.migration.reason'], 'worker_failed');
    assert.equal(migration!.attributes['ebb.migration.from_worker'], victim.workerId);
    assert.equal(migration!.attributes['ebb.worker.id'], survivor.workerId);
    assert.ok((migration!.attributes['ebb.tokens_delivered'] as number) >= 10, 'the tokens delivered before the move');
    const second = attempts.find((a) => a.attributes['ebb.worker.id'] === survivor.workerId)!;
    assert.equal(second.parentSpanId, migration!.spanId, 'the second attempt is under the migration');
    const on = spans.find((s) => s.name === 'POST /generate' && s.resource['service.instance.id'] === survivor.workerId)!;
    assert.equal(on.parentSpanId, second.spanId, "the second worker's span is under its attempt");
    assert.equal(on.attributes['ebb.worker.id'], survivor.workerId);
    assert.ok(on.events.some((e) => e.name === 'admitted') && on.events.some((e) => e.name === 'first_token'), 'admission and the first token, as events');
    assert.ok(receiver.contentTypes.has('application/x-protobuf'), 'exported as http/protobuf');
    const moved = await frontend.waitForEvent('stream_migrated');
    assert.equal(moved.trace_id, client.traceId, 'the migration log line names the trace');
  });
});

describe('traces: a kept stream taken over after its frontend is SIGKILLed', { skip: redisSkipReason() }, () => {
  let redis: RedisServer;
  before(async () => {
    redis = await startRedis();
  });
  after(async () => {
    await redis?.stop();
  });

  it('exports one trace across both frontends: the first frontend\'s request and attempt, the second\'s takeover under that request, and each worker\'s span under its attempt', async () => {
    const env = receiver.env('http/json');
    const discovery = tempDiscoveryUrl();
    const worker = await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '20', '--mocker-ttft-ms', '0'], env);
    started.push(worker);
    const [a, b] = (await Promise.all([0, 1].map(() => startFrontend(discovery, ['--stream-store', redis.url], env)))) as [FrontendHandle, FrontendHandle];
    started.push(a, b);
    await Promise.all([a, b].map((f) => frontendSeesWorkers(f, 1)));
    const client = clientTrace();
    const cut = new AbortController();
    const res = await fetch(`${a.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-ebb-resumable': '1', traceparent: client.traceparent },
      body: JSON.stringify({ model: 'm1', messages: [{ role: 'user', content: 'tell me about tides' }], max_tokens: 60, seed: 5, stream: true }),
      signal: cut.signal,
    });
    assert.equal(res.status, 200);
    const answered = res.headers.get('traceparent');
    assert.ok(answered?.startsWith(`00-${client.traceId}-`), `the answer names the client's trace: ${answered}`);
    const requestSpan = spanOf(answered);
    let id = '';
    let events = 0;
    for await (const data of sseData(res.body as AsyncIterable<Uint8Array>)) {
      id ||= (JSON.parse(data) as { id: string }).id;
      if (++events === 10) break;
    }
    // What the first frontend exported before its death (its request span ended at the head, its attempt at the worker's first tokens).
    await receiver.waitFor((spans) => spans.some((s) => s.spanId === requestSpan) && spans.some((s) => s.parentSpanId === requestSpan && s.name === 'ebb.attempt /generate'), "the first frontend's request and attempt spans");
    a.proc.kill('SIGKILL');
    cut.abort();
    const resumed = await fetch(`${b.url}/v1/chat/completions/${id}?stream=true&starting_after=9`);
    assert.equal(resumed.status, 200);
    let done = false;
    for await (const data of sseData(resumed.body as AsyncIterable<Uint8Array>)) if (data === '[DONE]') done = true;
    assert.ok(done, 'the resumed stream ended whole');
    await b.waitForEvent('stream_taken_over');
    await receiver.waitFor((spans) => {
      const t = spans.filter((s) => s.traceId === client.traceId);
      const takeover = byName(t, 'ebb.takeover')[0];
      return takeover !== undefined && t.filter((s) => s.name === 'POST /generate').length === 2 && t.some((s) => s.name === 'ebb.attempt /generate' && s.parentSpanId === takeover.spanId);
    }, 'the takeover\'s spans');
    const spans = receiver.trace(client.traceId);
    assertParentLinked(spans, client);
    const request = spans.find((s) => s.spanId === requestSpan)!;
    assert.equal(request.name, 'POST /v1/chat/completions');
    assert.equal(request.parentSpanId, client.spanId);
    const [takeover] = byName(spans, 'ebb.takeover');
    assert.equal(takeover!.parentSpanId, requestSpan, "the takeover is a child of the first frontend's request span");
    assert.equal(takeover!.attributes['gen_ai.response.id'], id);
    const frontends = new Set([request.resource['service.instance.id'], takeover!.resource['service.instance.id']]);
    assert.equal(frontends.size, 2, 'spans of both frontends');
    const attempts = spans.filter((s) => s.name === 'ebb.attempt /generate');
    const workerSpans = spans.filter((s) => s.name === 'POST /generate');
    for (const w of workerSpans) assert.ok(attempts.some((x) => x.spanId === w.parentSpanId), "each worker span is under a frontend's attempt");
    assert.ok(workerSpans.some((w) => w.parentSpanId === attempts.find((x) => x.parentSpanId === takeover!.spanId)?.spanId), "the continuation's worker span is under the takeover's attempt");
    assert.ok(receiver.contentTypes.has('application/json'), 'exported as http/json');
  });
});

describe('traces: --engine openai', () => {
  let sim: EngineSim;
  before(async () => {
    sim = await startEngineSim({ kind: 'vllm', itlMs: 5 });
  });
  after(async () => {
    await sim?.close();
  });

  it("the engine server gets the worker's span as its traceparent; with tracing off, no traceparent anywhere", async () => {
    const env = receiver.env();
    const discovery = tempDiscoveryUrl();
    const traced = await startWorker(['--discovery', discovery, '--model', 'm1', '--engine', 'openai', '--engine-url', sim.url, '--engine-kind', 'vllm'], env);
    started.push(traced);
    const frontend = await startFrontend(discovery, [], env);
    started.push(frontend);
    await frontendSeesWorkers(frontend, 1);
    const client = clientTrace();
    const outcome = await streamCompletion(frontend.url, { model: 'm1', max_tokens: 5 }, undefined, undefined, { traceparent: client.traceparent });
    assert.equal(outcome.error, undefined);
    const seen = sim.seen.filter((r) => r.path === '/v1/chat/completions').at(-1)!;
    const sent = String(seen.headers?.traceparent ?? '');
    assert.ok(sent.startsWith(`00-${client.traceId}-`), `the engine got the client's trace: "${sent}"`);
    await receiver.waitFor((spans) => spans.some((s) => s.spanId === spanOf(sent)), "the worker's span the engine's parent names");
    const parent = receiver.spans.find((s) => s.spanId === spanOf(sent))!;
    assert.equal(parent.name, 'POST /generate');
    assert.equal(parent.attributes['ebb.worker.id'], traced.workerId);

    // The same fleet without the variables: no SDK started, nothing sent on, nothing answered.
    const plainDiscovery = tempDiscoveryUrl();
    const plain = await startWorker(['--discovery', plainDiscovery, '--model', 'm1', '--engine', 'openai', '--engine-url', sim.url, '--engine-kind', 'vllm']);
    started.push(plain);
    const plainFrontend = await startFrontend(plainDiscovery);
    started.push(plainFrontend);
    await frontendSeesWorkers(plainFrontend, 1);
    const before = sim.seen.length;
    const res = await fetch(`${plainFrontend.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', traceparent: client.traceparent },
      body: JSON.stringify({ model: 'm1', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 }),
    });
    assert.equal(res.status, 200);
    assert.equal(res.headers.get('traceparent'), null, 'no traceparent answered with tracing off');
    await res.json();
    const after = sim.seen.slice(before).filter((r) => r.path === '/v1/chat/completions');
    assert.equal(after.length, 1);
    assert.equal(after[0]!.headers?.traceparent, undefined, 'the engine gets no traceparent with tracing off');
    assert.equal(plain.indexOfEvent('tracing_started'), -1);
    assert.equal(plainFrontend.indexOfEvent('tracing_started'), -1);
  });
});
