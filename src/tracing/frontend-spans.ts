import type * as Api from '@opentelemetry/api';
import { ATTR } from './attributes.js';
import { contextOfTraceparent, endFailed, startSpan, traceparentOf, withTraceHeaders } from './context.js';
import { bindBodies, traceOf } from './request-trace.js';
import { tracing } from './tracing.js';

/**
 * The frontend's spans inside a request's trace: its wait in the admission queue, each routing
 * decision and worker attempt, a migration to another worker, a takeover by another frontend, a
 * resume. Each helper returns undefined at once when tracing is off (callers pass values they
 * already hold: nothing is allocated for a span that is not made), or when the body has no trace.
 */

/** One request's wait in its model's admission queue: ended with how it left (admitted, left, shed). */
export function queueSpan(body: object, model: string, tier: string, tenant: string, depth: number): Api.Span | undefined {
  const t = tracing();
  const parent = t === undefined ? undefined : traceOf(body);
  if (t === undefined || parent === undefined) return undefined;
  return startSpan(t, 'ebb.queue', parent, { attributes: { [ATTR.model]: model, [ATTR.tier]: tier, [ATTR.tenant]: tenant, [ATTR.queueDepth]: depth } }).span;
}

export function endQueueSpan(span: Api.Span, outcome: string, waitedMs: number): void {
  span.setAttributes({ [ATTR.queueOutcome]: outcome, [ATTR.queueWaitMs]: waitedMs });
  span.end();
}

/** An event on the span a body is sent in (a 429 or 503 the queue answered before any wait). */
export function bodyEvent(body: object, name: string, attributes: Api.Attributes): void {
  const t = tracing();
  const ctx = t === undefined ? undefined : traceOf(body);
  if (t !== undefined && ctx !== undefined) t.api.trace.getSpan(ctx)?.addEvent(name, attributes);
}

/** What a router chose and why, for its span: the candidates it scored, the one it chose, the scores of the best few. */
export interface RouteDecision {
  router: string;
  candidates: number;
  chosen: string;
  promptTokens?: number | undefined;
  cachedTokens?: number | undefined;
  cost?: number | undefined;
  /** The best few, cheapest first: worker, cached prompt tokens, queued prefill tokens, in-flight, cost. */
  scores?: Array<{ worker_id: string; cached_tokens: number; queued_prefill_tokens: number; inflight: number; cost: number }> | undefined;
}

/** Told the decision once the router made it; the span covers the pick. Undefined: nobody wants it (no tracing, no trace). */
export type RouteExplain = (decision: RouteDecision) => void;

export function routeExplain(body: object | undefined, model: string, mode: string): RouteExplain | undefined {
  const t = tracing();
  const parent = t === undefined || body === undefined ? undefined : traceOf(body);
  if (t === undefined || parent === undefined) return undefined;
  const startTime = Date.now();
  return (d) => {
    const { span } = startSpan(t, 'ebb.route', parent, {
      startTime,
      attributes: {
        [ATTR.model]: model,
        [ATTR.mode]: mode,
        [ATTR.router]: d.router,
        [ATTR.candidates]: d.candidates,
        [ATTR.workerId]: d.chosen,
        ...(d.promptTokens === undefined ? {} : { [ATTR.promptTokens]: d.promptTokens }),
        ...(d.cachedTokens === undefined ? {} : { [ATTR.cachedTokens]: d.cachedTokens }),
        ...(d.cost === undefined ? {} : { [ATTR.cost]: d.cost }),
        ...(d.scores === undefined ? {} : { [ATTR.scores]: JSON.stringify(d.scores) }),
      },
    });
    span.end();
  };
}

/** One try of a request on one worker: from sending it to the worker's first tokens (its admission), or to its refusal. */
export interface AttemptTrace {
  span: Api.Span;
  /** The request-plane headers of this attempt: the caller's, plus its traceparent. */
  headers: Record<string, string>;
}

export function startAttempt(body: object | undefined, worker: { worker_id: string; model: string; mode: string }, path: string, headers: Record<string, string>): AttemptTrace | undefined {
  const t = tracing();
  const parent = t === undefined || body === undefined ? undefined : traceOf(body);
  if (t === undefined || parent === undefined) return undefined;
  const { span, ctx } = startSpan(t, `ebb.attempt ${path}`, parent, {
    kind: t.api.SpanKind.CLIENT,
    attributes: { [ATTR.workerId]: worker.worker_id, [ATTR.model]: worker.model, [ATTR.mode]: worker.mode, [ATTR.urlPath]: path },
  });
  return { span, headers: withTraceHeaders(t, ctx, headers) };
}

/** The attempt ended: `outcome` is the routing record's (routed, worker_draining, unreachable, ...). */
export function endAttempt(a: AttemptTrace, outcome: string, error?: unknown): void {
  const t = tracing();
  a.span.setAttribute(ATTR.outcome, outcome);
  if (outcome === 'routed' || t === undefined) return a.span.end();
  endFailed(t, a.span, outcome, error instanceof Error ? error.message : outcome);
}

/** A stream moving to another worker: a new attempt in the same trace, with why and how far it had come. */
export interface MigrationTrace {
  span: Api.Span;
}

export function startMigration(from: object, next: object, reason: string, fromWorker: string, tokensDelivered: number, number: number): MigrationTrace | undefined {
  const t = tracing();
  const parent = t === undefined ? undefined : traceOf(from);
  if (t === undefined || parent === undefined) return undefined;
  const { span, ctx } = startSpan(t, 'ebb.migration', parent, {
    attributes: { [ATTR.migrationReason]: reason, [ATTR.fromWorker]: fromWorker, [ATTR.tokensDelivered]: tokensDelivered, [ATTR.migrationNumber]: number },
  });
  bindBodies([next], ctx);
  return { span };
}

export function endMigration(m: MigrationTrace, toWorker: string | undefined, failure?: { code: string; message: string }): void {
  const t = tracing();
  if (toWorker !== undefined) m.span.setAttribute(ATTR.workerId, toWorker);
  if (failure === undefined || t === undefined) return m.span.end();
  endFailed(t, m.span, failure.code, failure.message);
}

/**
 * A stream another frontend started, continued here: a child of that frontend's request span (its
 * traceparent, copied with the stream's plan), in the same trace. `bodies` are sent in it.
 */
export function startTakeover(traceparent: string | undefined, bodies: readonly object[], responseId: string, eventsKept: number): Api.Span | undefined {
  const t = tracing();
  if (t === undefined || traceparent === undefined) return undefined;
  const { span, ctx } = startSpan(t, 'ebb.takeover', contextOfTraceparent(t, traceparent), { attributes: { [ATTR.responseId]: responseId, [ATTR.eventsKept]: eventsKept } });
  bindBodies(bodies, ctx);
  return span;
}

export function endTakeover(span: Api.Span, failure?: { code: string; message: string }): void {
  const t = tracing();
  if (failure === undefined || t === undefined) return span.end();
  endFailed(t, span, failure.code, failure.message);
}

/** The traceparent of the span a body is sent in: what a kept stream's plan carries to the frontend that may take it over. */
export function bodyTraceparent(body: object): string | undefined {
  const t = tracing();
  const ctx = t === undefined ? undefined : traceOf(body);
  return t === undefined || ctx === undefined ? undefined : traceparentOf(t, ctx);
}

/** The traceparents of the streams this frontend keeps (bounded, oldest first out): what a resume here links to. */
const keptTraces = new Map<string, string>();
const KEPT_TRACES = 10_000;

/** A kept stream's trace, for the resumes of it this frontend serves. */
export function keepTrace(responseId: string, traceparent: string | undefined): void {
  if (traceparent === undefined) return;
  keptTraces.set(responseId, traceparent);
  if (keptTraces.size > KEPT_TRACES) keptTraces.delete(keptTraces.keys().next().value!);
}

/**
 * A client resuming a kept stream: a span of its request (`req`'s), linked to the trace of the
 * request that started the stream where this frontend kept it; ended when the resume's response closes.
 */
export function traceResume(request: Api.Context | undefined, res: { once(event: 'close', listener: () => void): unknown }, responseId: string, after: unknown): void {
  const t = tracing();
  if (t === undefined || request === undefined) return;
  const original = keptTraces.get(responseId);
  const linked = original === undefined ? undefined : t.api.trace.getSpanContext(contextOfTraceparent(t, original));
  const { span } = startSpan(t, 'ebb.resume', request, { links: linked === undefined ? [] : [{ context: linked }], attributes: { [ATTR.responseId]: responseId, ...(typeof after === 'string' || typeof after === 'number' ? { [ATTR.resumeFrom]: String(after) } : {}) } });
  res.once('close', () => span.end());
}
