import type * as Api from '@opentelemetry/api';
import type { Tracing } from './tracing.js';

/** The trace context a request carries in its W3C headers (traceparent, tracestate); the root when it has none. */
export function extractContext(t: Tracing, headers: Record<string, unknown>): Api.Context {
  return t.propagator.extract(t.api.ROOT_CONTEXT, headers, t.api.defaultTextMapGetter);
}

/** `headers` plus the W3C headers of `ctx` (a copy: the caller's object is shared by every request). */
export function withTraceHeaders(t: Tracing, ctx: Api.Context, headers: Record<string, string>): Record<string, string> {
  const out = { ...headers };
  t.propagator.inject(ctx, out, t.api.defaultTextMapSetter);
  return out;
}

/** The traceparent header value of `ctx` (undefined when it holds no valid span). */
export function traceparentOf(t: Tracing, ctx: Api.Context): string | undefined {
  const carrier: Record<string, string> = {};
  t.propagator.inject(ctx, carrier, t.api.defaultTextMapSetter);
  return carrier.traceparent;
}

/** The context a traceparent (as traceparentOf wrote it) names: a remote parent for spans elsewhere (another frontend). */
export function contextOfTraceparent(t: Tracing, traceparent: string): Api.Context {
  return extractContext(t, { traceparent });
}

/** A span started under `parent` (the root when none), and the context its own children start from. */
export function startSpan(t: Tracing, name: string, parent: Api.Context | undefined, options: Api.SpanOptions): { span: Api.Span; ctx: Api.Context } {
  const base = parent ?? t.api.ROOT_CONTEXT;
  const span = t.tracer.startSpan(name, options, base);
  return { span, ctx: t.api.trace.setSpan(base, span) };
}

/** Ends `span` as failed with `code` (an ebb error code, or the error's name) and its message. */
export function endFailed(t: Tracing, span: Api.Span, code: string, message: string): void {
  span.setAttribute('error.type', code);
  span.setStatus({ code: t.api.SpanStatusCode.ERROR, message });
  span.end();
}

/** The ids of `ctx`'s span, for a log line: trace_id and span_id, as OpenTelemetry's log correlation names them. */
export function idsOf(t: Tracing, ctx: Api.Context | undefined): { trace_id: string; span_id: string } | undefined {
  const sc = ctx === undefined ? undefined : t.api.trace.getSpanContext(ctx);
  return sc === undefined || !t.api.isSpanContextValid(sc) ? undefined : { trace_id: sc.traceId, span_id: sc.spanId };
}
