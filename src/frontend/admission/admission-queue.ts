import type { Logger } from 'pino';
import { EbbError } from '../../protocol/errors.js';
import { ModelQueue, type QueueOwner } from './model-queue.js';
import type { QueueFleet } from './queue-fleet.js';
import type { QueueDepths, QueueMetrics } from './queue-metrics.js';
import { queueRetryAfterS } from './service-rate.js';
import { ticketOf, type Ticket } from './ticket.js';
import { Waiter, type Class, type Outcome, type Place } from './waiter.js';
import type { Span } from '@opentelemetry/api';
import { bodyEvent, endQueueSpan, queueSpan } from '../../tracing/frontend-spans.js';
import { bodyLogIds } from '../../tracing/request-trace.js';

/** A worker restart (drain, replace, register) fits in it. */
export const DEFAULT_QUEUE_TIMEOUT_MS = 30_000;
/** Per model: a few seconds of a busy fleet's arrivals; past it a wait would rarely end in time. */
export const DEFAULT_QUEUE_DEPTH = 256;

export interface AdmissionQueueOptions {
  timeoutMs: number;
  depth: number;
  log: Logger;
}

/** A continuation's ticket: it has no tenant's share to wait in, and its own class. */
const CONTINUATION: Ticket = { tier: 'priority', tenant: '-', cost: 0 };

/**
 * Requests no worker can take now wait here, per model, instead of failing: up to the queue
 * timeout, within the queue depth. A request enters only after its pick found no worker (the
 * fast path costs one map lookup: is anybody queued for this model?), or when others of its model
 * are already waiting (it does not pass them). Each model's queue (ModelQueue) gives the turns and
 * owns its waiters' states (Waiter); this holds the models' queues and answers for them: who may
 * enter, the 429s and 503s with their Retry-After, the metrics and the log.
 */
export class AdmissionQueue implements QueueOwner, QueueDepths {
  private readonly models = new Map<string, ModelQueue>();
  /** Tracing on: each waiter's span (from its entry to how it left) and its body's log ids. */
  private readonly traced = new WeakMap<Waiter, { span: Span; ids: object }>();

  constructor(
    readonly opts: AdmissionQueueOptions,
    private readonly fleet: QueueFleet,
    readonly metrics: QueueMetrics,
  ) {
    metrics.observe(this);
  }

  /** Waiters of `model` (0: the fast path routes at once). */
  waiting(model: string): number {
    return this.models.get(model)?.size ?? 0;
  }

  /**
   * Waiters the request with `body` would wait behind (0: the fast path routes it at once). A
   * priority request waits only behind continuations and priority requests: flex (or default)
   * waiting for a worker's room never delays it, and a worker that takes it where every slot runs
   * flex pauses one (--preemption-limit). Any other request: every waiter.
   */
  waitingBefore(body: { model: string }): number {
    const q = this.models.get(body.model);
    if (q === undefined) return 0;
    if (ticketOf(body)?.tier !== 'priority') return q.size;
    let n = 0;
    for (const cls of ['continuation', 'priority'] as const) for (const list of q.classes.get(cls)?.tenants.values() ?? []) n += list.length;
    return n;
  }

  /** Waiters of `model` by class (continuation and the tiers), those with any: the dashboard's split. */
  waitingByTier(model: string): Record<string, number> {
    const out: Record<string, number> = {};
    const q = this.models.get(model);
    if (q !== undefined)
      for (const [cls, c] of q.classes) {
        let n = 0;
        for (const list of c.tenants.values()) n += list.length;
        if (n > 0) out[cls] = n;
      }
    return out;
  }

  /** Every model's queue, for the gauges: [model, class, tenant, waiters]. */
  *depths(): Generator<[string, Class, string, number]> {
    for (const q of this.models.values()) for (const [cls, c] of q.classes) for (const [tenant, list] of c.tenants) yield [q.model, cls, tenant, list.length];
  }

  modelDepths(): Map<string, number> {
    return new Map([...this.models.values()].map((q) => [q.model, q.size]));
  }

  /**
   * A place in `model`'s queue for the request with `body`, or the answer it gets instead: `cause`
   * (its 503, with a Retry-After where one is known) when waiting cannot help, 429 when the queue is
   * full (a flex waiter gives its place to a higher tier first). `need`: what a worker must offer to
   * take it (see ModelQueue); `skip`: the workers it may not go to (the one a continuation leaves).
   */
  async enter(body: { model: string }, signal: AbortSignal, cause: EbbError, need: string, skip: ReadonlySet<string>): Promise<Place> {
    const model = body.model;
    const ticket = ticketOf(body);
    const cls: Class = ticket === undefined ? 'continuation' : ticket.tier;
    if (this.waiting(model) === 0 && !(await this.fleet.prospects(model, skip))) {
      this.metrics.shed(model, 'no_worker');
      bodyEvent(body, 'ebb.queue.shed', { 'ebb.queue.reason': 'no_worker' });
      throw this.withRetryAfter(cause, model);
    }
    if (signal.aborted) throw signal.reason;
    if (ticket?.client?.aborted === true) throw ticket.client.reason;
    let q = this.models.get(model);
    if (!q) this.models.set(model, (q = new ModelQueue(model, this)));
    // A preempted flex stream coming back is a stream mid-answer, as a continuation is: it displaces, and is never shed for its wait.
    const preempted = ticket?.preempted === true;
    if (q.size >= this.opts.depth) {
      const flex = cls === 'flex' && !preempted ? undefined : q.newestFlex();
      if (flex === undefined) {
        bodyEvent(body, 'ebb.queue.shed', { 'ebb.queue.reason': 'queue_full' });
        throw this.shed(q, 'queue_full', `the queue for "${model}" is full (${this.opts.depth} waiting)`);
      }
      q.leave(flex, 'shed', this.shedError(q, `a higher-tier request took this flex request's place in the full queue for "${model}"`));
      this.metrics.shed(model, 'flex_displaced');
      // Its leaving may have emptied (and dropped) the model's queue: the newcomer's is this one.
      this.models.set(model, q);
    } else if (cls === 'flex' && !preempted) {
      // Flex goes first when its wait would not end in time anyway.
      const rate = q.rate.perSecond(performance.now());
      const ahead = q.size;
      if (rate !== undefined && ahead / rate > this.opts.timeoutMs / 1000) {
        bodyEvent(body, 'ebb.queue.shed', { 'ebb.queue.reason': 'expected_wait' });
        throw this.shed(q, 'expected_wait', `flex requests for "${model}" would wait about ${Math.ceil(ahead / rate)} s, past the queue timeout`);
      }
    }
    const t = ticket ?? CONTINUATION;
    const w = new Waiter(q, cls, t, need, [signal, t.client], this.opts.timeoutMs);
    this.metrics.entered(model, cls, t.tenant);
    const span = queueSpan(body, model, cls, t.tenant, q.size + 1);
    const ids = bodyLogIds(body);
    if (span !== undefined) this.traced.set(w, { span, ids });
    this.opts.log.info({ event: 'request_queued', model, tier: cls, tenant: t.tenant, depth: q.size + 1, ...ids }, `no worker of "${model}" can take a ${cls} request now: queued (${q.size + 1} waiting)`);
    q.add(w);
    // Queued requests do not count against their tenant's concurrent streams: its slot goes back until its turn.
    t.hold?.queued();
    return w;
  }

  /** The fleet may take more of `model` (a registration, a freed slot, a worker with room again). */
  changed(model: string): void {
    this.models.get(model)?.changed();
  }

  routable(model: string): number {
    return this.fleet.routable(model);
  }

  left(q: ModelQueue, w: Waiter, outcome: Outcome): void {
    const waited = (performance.now() - w.enteredAt) / 1000;
    this.metrics.left(q.model, w.cls, w.ticket.tenant, waited, outcome);
    const traced = this.traced.get(w);
    if (traced !== undefined) endQueueSpan(traced.span, outcome, Math.round(waited * 1000));
    this.opts.log.info(
      { event: 'request_dequeued', model: q.model, tier: w.cls, tenant: w.ticket.tenant, outcome, waited_ms: Math.round(waited * 1000), depth: q.size, ...traced?.ids },
      `a queued ${w.cls} request for "${q.model}" ${outcome} after ${Math.round(waited * 1000)} ms`,
    );
    if (q.size === 0 && this.models.get(q.model) === q) this.models.delete(q.model);
  }

  expire(q: ModelQueue, w: Waiter): void {
    this.metrics.shed(q.model, 'queue_timeout');
    q.leave(w, 'shed', this.shedError(q, `no worker of "${q.model}" could take the request within the queue timeout (${this.opts.timeoutMs} ms)`));
  }

  private shed(q: ModelQueue, reason: 'queue_full' | 'expected_wait', message: string): EbbError {
    this.metrics.shed(q.model, reason);
    return this.shedError(q, message);
  }

  /** A shed request's 429: OpenAI's rate_limit_exceeded (the message says why; the shed metric's reason label counts each). */
  private shedError(q: ModelQueue, message: string): EbbError {
    return new EbbError('rate_limit_exceeded', message, { headers: { 'retry-after': String(queueRetryAfterS(q.size, q.rate.perSecond(performance.now()), this.opts.timeoutMs)) } });
  }

  /** A 503 from the queue carries a Retry-After only where the model's admission rate says one. */
  private withRetryAfter(err: EbbError, model: string): EbbError {
    const q = this.models.get(model);
    const rate = q?.rate.perSecond(performance.now());
    if (q !== undefined && rate !== undefined) err.headers = { ...err.headers, 'retry-after': String(queueRetryAfterS(q.size, rate, this.opts.timeoutMs)) };
    return err;
  }
}
