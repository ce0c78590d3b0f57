import type * as Api from '@opentelemetry/api';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { ATTR } from './attributes.js';
import { endFailed, extractContext, idsOf, startSpan, traceparentOf } from './context.js';
import { tracing } from './tracing.js';

/**
 * The frontend's span of one public API request, from its arrival to its response head: the
 * client's `traceparent` is its parent (a new trace without one), and the answer carries this
 * span's own `traceparent` back. It ends at the head (a stream's is its time to first token), so
 * the spans that continue the request (a migration, another frontend's takeover) hang under a span
 * that was exported already; a frontend killed mid-stream loses only `ebb.stream`, the span of the
 * body it was writing (head to close), which nothing else hangs under.
 */
interface RequestTrace {
  span: Api.Span;
  ctx: Api.Context;
  ended: boolean;
  /** The body after the head, for an event stream. */
  stream?: Api.Span | undefined;
  /** An error event the stream ended with (the relay's, or a kept stream's end). */
  failure?: { code: string; message: string } | undefined;
}

/** By the raw request and by its response: the routes hold one, the relay the other. */
const traces = new WeakMap<IncomingMessage | ServerResponse, RequestTrace>();
/** The context a request body (GenerateBody, EmbedBody, a continuation) is sent in. */
const bodies = new WeakMap<object, Api.Context>();

/** The header a response names its request's span in (W3C trace context). */
export const TRACEPARENT = 'traceparent';

/**
 * Opens `req`'s span (`route`: the route's pattern, for the span's name). Only called where
 * tracing is on (the hook is registered then).
 */
export function traceHttpRequest(req: IncomingMessage, res: ServerResponse, route: string, requestId: string | undefined): void {
  const t = tracing();
  if (t === undefined) return;
  const parent = extractContext(t, req.headers);
  const { span, ctx } = startSpan(t, `${req.method} ${route}`, parent, {
    kind: t.api.SpanKind.SERVER,
    attributes: { [ATTR.httpMethod]: req.method ?? '', [ATTR.httpRoute]: route, ...(requestId === undefined ? {} : { [ATTR.requestId]: requestId }) },
  });
  const trace: RequestTrace = { span, ctx, ended: false };
  traces.set(req, trace);
  traces.set(res, trace);
  const traceparent = traceparentOf(t, ctx);
  if (traceparent !== undefined) res.setHeader(TRACEPARENT, traceparent);
  // Node has no event for the head: the span ends as it is written, whoever writes it (fastify, the relay, a resume).
  const writeHead = res.writeHead;
  res.writeHead = function (this: ServerResponse, ...args: unknown[]) {
    const out = (writeHead as (...a: unknown[]) => ServerResponse).apply(this, args);
    headWritten(trace, res);
    return out;
  } as typeof res.writeHead;
  res.once('close', () => closed(trace, res));
}

function headWritten(trace: RequestTrace, res: ServerResponse): void {
  const t = tracing();
  if (t === undefined || trace.ended) return;
  trace.ended = true;
  const status = res.statusCode;
  trace.span.setAttribute(ATTR.httpStatus, status);
  if (status >= 500) trace.span.setStatus({ code: t.api.SpanStatusCode.ERROR });
  trace.span.end();
  if (String(res.getHeader('content-type') ?? '').startsWith('text/event-stream')) trace.stream = startSpan(t, 'ebb.stream', trace.ctx, {}).span;
}

function closed(trace: RequestTrace, res: ServerResponse): void {
  const t = tracing();
  if (t === undefined) return;
  if (!trace.ended) {
    // Closed before any head: the client left while the request waited (queued, routing).
    trace.ended = true;
    trace.span.setAttribute(ATTR.outcome, 'client_gone');
    trace.span.end();
    return;
  }
  const stream = trace.stream;
  if (stream === undefined) return;
  if (trace.failure !== undefined) return endFailed(t, stream, trace.failure.code, trace.failure.message);
  stream.setAttribute(ATTR.outcome, res.writableFinished ? 'completed' : 'client_gone');
  stream.end();
}

/** The request's span context (for its bodies, a kept stream's plan), or undefined. */
export function requestContext(req: IncomingMessage | ServerResponse): Api.Context | undefined {
  return traces.get(req)?.ctx;
}

/**
 * Binds a request's bodies to its span (what they are sent to workers in) and names what it asks
 * for on the span: the model (an adapter's name as the client gave it), tier and tenant.
 */
export function traceBodies(req: IncomingMessage, gens: ReadonlyArray<object & { model: string; adapter?: string | undefined }>, tier: string, tenant: () => string): void {
  const trace = traces.get(req);
  if (trace === undefined) return;
  for (const g of gens) bodies.set(g, trace.ctx);
  const first = gens[0];
  if (first === undefined) return;
  const id = (first as { request_id?: string }).request_id;
  trace.span.setAttributes({
    [ATTR.model]: first.adapter ?? first.model,
    [ATTR.tier]: tier,
    [ATTR.tenant]: tenant(),
    // The response id (a request of several sequences numbers them: id-0, id-1, ...).
    ...(id === undefined ? {} : { [ATTR.responseId]: gens.length > 1 ? id.replace(/-0$/, '') : id }),
  });
}

/** Binds `bodies` to `ctx` (a takeover's, a migration's): their attempts are its children. */
export function bindBodies(list: readonly object[], ctx: Api.Context | undefined): void {
  if (ctx === undefined) return;
  for (const b of list) bodies.set(b, ctx);
}

/** The context `body` is sent in; undefined when tracing is off or it has none. */
export function traceOf(body: object): Api.Context | undefined {
  return tracing() === undefined ? undefined : bodies.get(body);
}

/** `child` (a continuation, a body with its KV named) is sent in the context of the body it was made from. */
export function inheritTrace(child: object, from: object): void {
  if (tracing() === undefined) return;
  const ctx = bodies.get(from);
  if (ctx !== undefined) bodies.set(child, ctx);
}

/** The response (`res`) ended with an error event: its stream span says so. Failure paths only. */
export function traceStreamFailure(res: ServerResponse, code: string, message: string): void {
  const trace = tracing() === undefined ? undefined : traces.get(res);
  if (trace !== undefined) trace.failure ??= { code, message };
}

/** A body's trace ids for a log line (spread into its fields): nothing when tracing is off or the body has none. */
export function bodyLogIds(body: object): { trace_id: string; span_id: string } | Record<string, never> {
  const t = tracing();
  if (t === undefined) return NO_IDS;
  return idsOf(t, bodies.get(body)) ?? NO_IDS;
}

const NO_IDS: Record<string, never> = Object.freeze({}) as Record<string, never>;
