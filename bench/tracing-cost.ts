/**
 * What tracing costs per request, with every request sampled (issue 46): the spans a frontend
 * makes for a streamed request that one worker serves (its request span, the routing decision, the
 * attempt with its traceparent headers, the stream span) and the one span a worker makes, each
 * exported over OTLP/HTTP (http/protobuf) by the real SDK to a sink in this process. CPU time per
 * request, spans, export and the sink's reading together; no model, no sockets of ebb's: the
 * figure is the tracing alone, free of the noise of a machine the end-to-end bench shares
 * (bench/frontend-overhead.ts measures that, with and without OTEL_EXPORTER_OTLP_ENDPOINT).
 *
 *   npx tsc -p . && node dist/bench/tracing-cost.js [requests (default 10000)]
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { pino } from 'pino';
import { extractContext, startSpan } from '../src/tracing/context.js';
import { endAttempt, routeExplain, startAttempt } from '../src/tracing/frontend-spans.js';
import { bindBodies } from '../src/tracing/request-trace.js';
import { startTracing, stopTracing, tracing } from '../src/tracing/tracing.js';
import { traceWorkerRequest } from '../src/tracing/worker-trace.js';

const N = Number(process.argv[2] ?? 10_000);
let posts = 0;
let bytes = 0;
const sink = createServer((req, res) => {
  req.on('data', (c: Buffer) => (bytes += c.length));
  req.on('end', () => {
    posts++;
    res.writeHead(200).end();
  });
});
await new Promise<void>((resolve) => sink.listen(0, '127.0.0.1', resolve));
process.env.OTEL_EXPORTER_OTLP_ENDPOINT = `http://127.0.0.1:${(sink.address() as AddressInfo).port}`;
const log = pino({ level: 'silent' });

const client = { traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', 'content-type': 'application/json' };

/** The frontend's spans of one streamed request one worker serves at once. */
function frontendRequest(): void {
  const t = tracing()!;
  const { span, ctx } = startSpan(t, 'POST /v1/chat/completions', extractContext(t, client), { kind: t.api.SpanKind.SERVER, attributes: { 'http.request.method': 'POST', 'http.route': '/v1/chat/completions', 'ebb.request_id': 'req_1' } });
  const gen = { model: 'm1' };
  bindBodies([gen], ctx);
  span.setAttributes({ 'gen_ai.request.model': 'm1', 'ebb.tier': 'default', 'ebb.tenant': 'anonymous', 'gen_ai.response.id': 'chatcmpl-1' });
  routeExplain(gen, 'm1', 'aggregated')?.({ router: 'kv', candidates: 2, chosen: 'w-1', promptTokens: 5, cachedTokens: 0, cost: 5, scores: [{ worker_id: 'w-1', cached_tokens: 0, queued_prefill_tokens: 0, inflight: 0, cost: 5 }] });
  endAttempt(startAttempt(gen, { worker_id: 'w-1', model: 'm1', mode: 'aggregated' }, '/generate', { 'content-type': 'application/json' })!, 'routed');
  span.setAttribute('http.response.status_code', 200);
  span.end();
  const stream = startSpan(t, 'ebb.stream', ctx, {}).span;
  stream.setAttribute('ebb.outcome', 'completed');
  stream.end();
}

const res = { once: () => res, headersSent: true, statusCode: 200 } as unknown as ServerResponse;
const req = { method: 'POST', headers: client } as unknown as IncomingMessage;

/** A worker's span of one /generate. */
function workerRequest(): void {
  const w = traceWorkerRequest(req, res, '/generate', 'w-1', 'm1')!;
  w.event('admitted', { 'ebb.request_id': 'r' });
  w.firstToken();
  w.usage({ prompt_tokens: 5, completion_tokens: 64, cached_tokens: 0, finish_reason: 'length' }, 3);
  w.outcome('completed');
  w.end(200);
}

for (const [name, request] of [
  ['frontend', frontendRequest],
  ['worker', workerRequest],
] as const) {
  await startTracing('bench', 'bench', log);
  for (let i = 0; i < 1000; i++) request();
  const before = process.cpuUsage();
  for (let i = 0; i < N; i++) {
    request();
    // Let the batch processor export as it would between requests.
    if (i % 50 === 0) await new Promise((resolve) => setImmediate(resolve));
  }
  await stopTracing(30_000);
  const used = process.cpuUsage(before);
  console.log(`${name}: ${((used.user + used.system) / N).toFixed(1)} µs CPU per request (spans and their export)`);
}
console.log(`exported: ${posts} posts, ${(bytes / 1e6).toFixed(1)} MB`);
sink.close();
