import type * as Api from '@opentelemetry/api';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { ATTR } from './attributes.js';
import { endFailed, extractContext, idsOf, startSpan, traceparentOf, withTraceHeaders } from './context.js';
import { tracing } from './tracing.js';

/**
 * A worker's span of one request-plane call (/generate, /prefill, /embed, /kv/{id}): a child of the
 * caller's attempt (its traceparent header), or a trace of its own. What happens inside it is told
 * as events (admitted, kv_pulled, first_token, handed_off), not child spans: a worker killed
 * mid-stream loses this open span, and no span it exported earlier is left pointing at it. Its
 * outcome and usage are attributes, set as the request ends.
 */
export class WorkerTrace {
  readonly traceparent: string | undefined;
  private ended = false;
  private firstAt: number | undefined;
  private readonly startedAt = performance.now();

  constructor(
    private readonly t: NonNullable<ReturnType<typeof tracing>>,
    readonly span: Api.Span,
    readonly ctx: Api.Context,
  ) {
    this.traceparent = traceparentOf(t, ctx);
  }

  event(name: string, attributes?: Api.Attributes): void {
    if (!this.ended) this.span.addEvent(name, attributes);
  }

  /** The engine's first token: prefill is over, decode begins. */
  firstToken(): void {
    if (this.firstAt !== undefined || this.ended) return;
    this.firstAt = performance.now();
    this.span.addEvent('first_token', { 'ebb.prefill_ms': Math.round(this.firstAt - this.startedAt) });
  }

  usage(u: { prompt_tokens: number; completion_tokens: number; cached_tokens?: number | undefined; finish_reason?: string | undefined }, maxGapMs?: number): void {
    if (this.ended) return;
    this.span.setAttributes({
      [ATTR.inputTokens]: u.prompt_tokens,
      [ATTR.outputTokens]: u.completion_tokens,
      ...(u.cached_tokens === undefined ? {} : { [ATTR.cachedPromptTokens]: u.cached_tokens }),
      ...(u.finish_reason === undefined ? {} : { [ATTR.finishReason]: [u.finish_reason] }),
      ...(maxGapMs === undefined ? {} : { [ATTR.maxTokenGapMs]: Math.round(maxGapMs) }),
      ...(this.firstAt === undefined ? {} : { 'ebb.decode_ms': Math.round(performance.now() - this.firstAt) }),
    });
  }

  /** How the request ended (the admission's release outcome: completed, dropped, errored, handed_off, ...). */
  outcome(outcome: string): void {
    if (!this.ended) this.span.setAttribute(ATTR.outcome, outcome);
  }

  /** Ends it failed, with the error code the caller was answered. */
  fail(code: string, message: string): void {
    if (this.ended) return;
    this.ended = true;
    this.span.setAttribute(ATTR.outcome, 'errored');
    endFailed(this.t, this.span, code, message);
  }

  end(status?: number): void {
    if (this.ended) return;
    this.ended = true;
    if (status !== undefined) this.span.setAttribute(ATTR.httpStatus, status);
    if (status !== undefined && status >= 500) this.span.setStatus({ code: this.t.api.SpanStatusCode.ERROR });
    this.span.end();
  }

  /** A span of work inside this request (a KV pull): its own child span, ended by the caller. */
  child(name: string, attributes: Api.Attributes): WorkerChild {
    const { span, ctx } = startSpan(this.t, name, this.ctx, { attributes });
    return new WorkerChild(this.t, span, ctx);
  }

  /** The request's trace ids, for its log lines. */
  logIds(): { trace_id: string; span_id: string } | Record<string, never> {
    return idsOf(this.t, this.ctx) ?? {};
  }
}

/** Work inside a worker's request that calls another process (a KV pull): its headers carry this span. */
export class WorkerChild {
  constructor(
    private readonly t: NonNullable<ReturnType<typeof tracing>>,
    readonly span: Api.Span,
    private readonly ctx: Api.Context,
  ) {}

  headers(base: Record<string, string>): Record<string, string> {
    return withTraceHeaders(this.t, this.ctx, base);
  }

  end(outcome: string, failure?: { code: string; message: string }): void {
    this.span.setAttribute(ATTR.outcome, outcome);
    if (failure === undefined) this.span.end();
    else endFailed(this.t, this.span, failure.code, failure.message);
  }
}

/**
 * Opens the worker's span of a request-plane call (tracing on only), ended when its response
 * closes (with its status) unless ended before. `route`: the route's pattern.
 */
export function traceWorkerRequest(req: IncomingMessage, res: ServerResponse, route: string, workerId: string, model: string): WorkerTrace | undefined {
  const t = tracing();
  if (t === undefined) return undefined;
  const { span, ctx } = startSpan(t, `${req.method} ${route}`, extractContext(t, req.headers), {
    kind: t.api.SpanKind.SERVER,
    attributes: { [ATTR.httpMethod]: req.method ?? '', [ATTR.httpRoute]: route, [ATTR.workerId]: workerId, [ATTR.model]: model },
  });
  const trace = new WorkerTrace(t, span, ctx);
  // After the request's own close listeners (its scope's, which tells the outcome).
  res.once('close', () => queueMicrotask(() => trace.end(res.headersSent ? res.statusCode : undefined)));
  return trace;
}

/** A span of a worker's own (an adapter load), a child of the request that caused it when one did. */
export function workerSpan(parent: WorkerTrace | undefined, name: string, attributes: Api.Attributes): WorkerChild | undefined {
  if (parent !== undefined) return parent.child(name, attributes);
  const t = tracing();
  if (t === undefined) return undefined;
  const { span, ctx } = startSpan(t, name, undefined, { attributes });
  return new WorkerChild(t, span, ctx);
}
