import type { Logger } from 'pino';
import { EbbError } from '../../protocol/errors.js';
import type { QueueMetrics } from './queue-metrics.js';
import type { RequestTier } from '../../protocol/request-plane.js';

/** OpenAI's service tiers (the request plane's, which the worker reads), first served first; `auto` is `default`. */
export type ServiceTier = RequestTier;
export const SERVICE_TIERS: readonly ServiceTier[] = ['priority', 'default', 'flex'];

/** A worker restart (drain, replace, register) fits in it. */
export const DEFAULT_QUEUE_TIMEOUT_MS = 30_000;
/** Per model: a few seconds of a busy fleet's arrivals; past it a wait would rarely end in time. */
export const DEFAULT_QUEUE_DEPTH = 256;
/** Admissions remembered per model for its service rate. */
const RATE_SAMPLES = 32;

/** Who asks, how urgently and for how much: set on a request's generate bodies by the API (tag). */
export interface Ticket {
  tier: ServiceTier;
  tenant: string;
  /** Tokens it asks for: the prompt's estimate plus max_tokens; its weight in its tenant's share. */
  cost: number;
}

export function serviceTier(value: unknown): ServiceTier {
  return value === 'priority' || value === 'flex' ? value : 'default';
}

/**
 * What the queue asks of the rest of the frontend: whether a worker may take a request of `model`
 * now (one in discovery and not held), and whether waiting can help at all (a worker in discovery,
 * or a drained one still answering that may resume).
 */
export interface QueueFleet {
  routable(model: string): number;
  /** `skip`: workers this request may not go to (the one a continuation leaves). */
  prospects(model: string, skip: ReadonlySet<string>): Promise<boolean>;
}

/** A request's place in its model's queue, from its first failed pick until it is admitted or leaves. */
export interface Place {
  /** Resolves when it is this request's turn to try the workers; rejects (429, 503, abort) when it will get none. */
  turn(): Promise<void>;
  /** A worker took it: it leaves the queue, and the next one gets its turn. */
  admitted(): void;
  /** Its turn found no worker that takes it: it keeps its place until the fleet changes. */
  refused(): void;
  /** It leaves with another answer (the client's error, a failure of its own). */
  leave(): void;
}

/** A continuation (a stream moving off a worker) has a client mid-answer: it goes before every tier. */
type Class = 'continuation' | ServiceTier;
const CLASSES: readonly Class[] = ['continuation', ...SERVICE_TIERS];

class Waiter implements Place {
  readonly enteredAt = performance.now();
  /** Granted a turn and trying the workers. */
  trying = false;
  /** Its fair-queueing tag within its tier (see TierQueue). */
  tag = 0;
  private wake: { resolve: () => void; reject: (err: unknown) => void } | undefined;
  private failure: unknown;
  private timer: NodeJS.Timeout | undefined;
  private readonly onAbort: () => void;

  constructor(
    readonly queue: ModelQueue,
    readonly cls: Class,
    readonly ticket: Ticket,
    private readonly signal: AbortSignal,
    timeoutMs: number,
  ) {
    this.timer = setTimeout(() => queue.expire(this), timeoutMs);
    this.onAbort = () => this.fail(signal.reason, 'left');
    signal.addEventListener('abort', this.onAbort, { once: true });
  }

  turn(): Promise<void> {
    if (this.failure !== undefined) return Promise.reject(this.failure);
    if (this.trying) return Promise.resolve();
    return new Promise((resolve, reject) => (this.wake = { resolve, reject }));
  }

  grant(): void {
    this.trying = true;
    const w = this.wake;
    this.wake = undefined;
    w?.resolve();
  }

  admitted(): void {
    this.queue.leave(this, 'admitted');
    this.stop();
  }

  refused(): void {
    // Timed out or left while trying: out of the queue already, and counted out of its turns.
    if (this.failure !== undefined) return;
    this.trying = false;
    this.queue.refused();
  }

  leave(): void {
    this.queue.leave(this, 'left');
    this.stop();
  }

  /** Out of the queue with `err` as its answer (a shed, its timeout, its client gone). */
  fail(err: unknown, why: 'left' | 'shed'): void {
    if (this.failure !== undefined) return;
    this.failure = err;
    this.queue.leave(this, why);
    this.stop();
    const w = this.wake;
    this.wake = undefined;
    w?.reject(err);
  }

  private stop(): void {
    clearTimeout(this.timer);
    this.signal.removeEventListener('abort', this.onAbort);
  }
}

/**
 * One tier's waiters: each tenant's in arrival order, served by start-time fair queueing weighted by
 * the tokens each request asks for (the deficit round robin's shares without its quantum: a
 * request's tag is where its tenant's tokens would end if every busy tenant were served in turn).
 * The smallest tag goes first; a flood only lengthens its own tenant's tags.
 */
class TierQueue {
  private readonly tenants = new Map<string, { waiters: Waiter[]; lastTag: number }>();
  /** The tag of the last request given a turn: a tenant that was idle starts from here, not from its old share. */
  private vtime = 0;
  size = 0;

  push(w: Waiter): void {
    let t = this.tenants.get(w.ticket.tenant);
    if (!t) this.tenants.set(w.ticket.tenant, (t = { waiters: [], lastTag: 0 }));
    w.tag = Math.max(this.vtime, t.lastTag) + Math.max(1, w.ticket.cost);
    t.lastTag = w.tag;
    t.waiters.push(w);
    this.size++;
  }

  remove(w: Waiter): boolean {
    const t = this.tenants.get(w.ticket.tenant);
    const i = t?.waiters.indexOf(w) ?? -1;
    if (i < 0) return false;
    t!.waiters.splice(i, 1);
    this.size--;
    if (t!.waiters.length === 0 && t!.lastTag <= this.vtime) this.tenants.delete(w.ticket.tenant);
    return true;
  }

  /** The waiter with the smallest tag not already trying (ties: the earlier arrival). */
  next(): Waiter | undefined {
    let best: Waiter | undefined;
    for (const t of this.tenants.values()) {
      const head = t.waiters.find((w) => !w.trying);
      if (head !== undefined && (best === undefined || head.tag < best.tag || (head.tag === best.tag && head.enteredAt < best.enteredAt))) best = head;
    }
    if (best !== undefined) this.vtime = Math.max(this.vtime, best.tag - Math.max(1, best.ticket.cost));
    return best;
  }

  /** The newest waiter (a flex one to shed for a higher tier). */
  newest(): Waiter | undefined {
    let out: Waiter | undefined;
    for (const t of this.tenants.values()) for (const w of t.waiters) if (!w.trying && (out === undefined || w.enteredAt > out.enteredAt)) out = w;
    return out;
  }

  /** Waiters per tenant (for the depth gauge). */
  *byTenant(): Generator<[string, number]> {
    for (const [tenant, t] of this.tenants) if (t.waiters.length > 0) yield [tenant, t.waiters.length];
  }
}

/** One model's waiters by class, and its recent admissions (the service rate a Retry-After is computed from). */
class ModelQueue {
  readonly classes = new Map<Class, TierQueue>(CLASSES.map((c) => [c, new TierQueue()]));
  size = 0;
  trying = 0;
  private readonly admittedAt: number[] = [];

  constructor(
    readonly model: string,
    private readonly owner: AdmissionQueue,
  ) {}

  add(w: Waiter): void {
    this.classes.get(w.cls)!.push(w);
    this.size++;
  }

  leave(w: Waiter, why: 'admitted' | 'left' | 'shed'): void {
    if (w.trying) this.trying--;
    w.trying = false;
    if (!this.classes.get(w.cls)!.remove(w)) return;
    this.size--;
    if (why === 'admitted') {
      this.admittedAt.push(performance.now());
      if (this.admittedAt.length > RATE_SAMPLES) this.admittedAt.shift();
    }
    this.owner.left(this, w, why);
  }

  refused(): void {
    this.trying--;
    // It waits for the next change, keeping its tag: trying again at once would spin on a fleet that has not moved.
  }

  expire(w: Waiter): void {
    this.owner.expire(this, w);
  }

  /** The waiter whose turn is next: continuations, then by tier. */
  next(): Waiter | undefined {
    for (const c of CLASSES) {
      const q = this.classes.get(c)!;
      if (q.size === 0) continue;
      const w = q.next();
      if (w) return w;
    }
    return undefined;
  }

  /** Admissions per second lately; undefined before there are two. */
  rate(): number | undefined {
    const n = this.admittedAt.length;
    if (n < 2) return undefined;
    const span = (performance.now() - this.admittedAt[0]!) / 1000;
    return span > 0 ? (n - 1) / span : undefined;
  }
}

export interface AdmissionQueueOptions {
  timeoutMs: number;
  depth: number;
  log: Logger;
}

/** Generate bodies' tickets, made when one waits: bodies the API made carry one; a continuation's body (made by a lane) does not. */
const tickets = new WeakMap<object, () => Ticket>();

/**
 * Requests no worker can take now wait here, per model, instead of failing: up to the queue
 * timeout, within the queue depth. A request enters only after its pick found no worker (the
 * fast path costs one map lookup: is anybody queued for this model?), or when others of its model
 * are already waiting (it does not pass them). Turns are given as the fleet changes (a worker
 * registers or resumes, a slot frees, a worker says it has room again): never on a timer. One turn
 * per routable worker is out at a time, so a resume is not met by the whole queue at once; a turn
 * that finds no worker keeps its place until the next change. Order: continuations (streams moving
 * off a draining worker: their client is mid-answer), then priority, default, flex; within a tier,
 * tenants in fair shares of the tokens their requests ask for (TierQueue).
 */
export class AdmissionQueue {
  private readonly models = new Map<string, ModelQueue>();

  constructor(
    readonly opts: AdmissionQueueOptions,
    private readonly fleet: QueueFleet,
    readonly metrics: QueueMetrics,
  ) {
    metrics.observe(this);
  }

  static tag(body: object, ticket: () => Ticket): void {
    tickets.set(body, ticket);
  }

  /** Waiters of `model` (0: the fast path routes at once). */
  waiting(model: string): number {
    return this.models.get(model)?.size ?? 0;
  }

  /** Every model's queue, for the gauges: [model, class, tenant, waiters]. */
  *depths(): Generator<[string, Class, string, number]> {
    for (const q of this.models.values()) for (const [cls, tier] of q.classes) for (const [tenant, n] of tier.byTenant()) yield [q.model, cls, tenant, n];
  }

  modelDepths(): Map<string, number> {
    return new Map([...this.models.values()].map((q) => [q.model, q.size]));
  }

  /**
   * A place in `model`'s queue for the request with `body`, or the answer it gets instead: `cause`
   * (its 503, with a Retry-After where one is known) when waiting cannot help, 429 when the queue is
   * full (a flex waiter gives its place to a higher tier first).
   */
  async enter(body: { model: string }, signal: AbortSignal, cause: EbbError, skip: ReadonlySet<string> = new Set()): Promise<Place> {
    const model = body.model;
    const ticket = tickets.get(body)?.();
    const cls: Class = ticket === undefined ? 'continuation' : ticket.tier;
    const t = ticket ?? { tier: 'priority', tenant: '-', cost: 0 };
    if (this.waiting(model) === 0 && !(await this.fleet.prospects(model, skip))) {
      this.metrics.shed(model, 'no_worker');
      throw this.withRetryAfter(cause, model);
    }
    if (signal.aborted) throw signal.reason;
    let q = this.models.get(model);
    if (!q) this.models.set(model, (q = new ModelQueue(model, this)));
    if (q.size >= this.opts.depth) {
      const flex = cls === 'flex' ? undefined : q.classes.get('flex')!.newest();
      if (flex === undefined) throw this.shed(q, 'queue_full', `the queue for "${model}" is full (${this.opts.depth} waiting)`);
      flex.fail(this.shedError(q, `a higher-tier request took this flex request's place in the full queue for "${model}"`), 'shed');
      this.metrics.shed(model, 'flex_displaced');
      // Its leaving may have emptied (and dropped) the model's queue: the newcomer's is this one.
      this.models.set(model, q);
    } else if (cls === 'flex') {
      // Flex goes first when its wait would not end in time anyway.
      const rate = q.rate();
      const ahead = q.size;
      if (rate !== undefined && ahead / rate > this.opts.timeoutMs / 1000) throw this.shed(q, 'expected_wait', `flex requests for "${model}" would wait about ${Math.ceil(ahead / rate)} s, past the queue timeout`);
    }
    const w = new Waiter(q, cls, t, signal, this.opts.timeoutMs);
    q.add(w);
    this.metrics.entered(model, cls);
    this.opts.log.info({ event: 'request_queued', model, tier: cls, tenant: t.tenant, depth: q.size }, `no worker of "${model}" can take a ${cls} request now: queued (${q.size} waiting)`);
    this.changed(model);
    return w;
  }

  /** The fleet may take more of `model` (a registration, a freed slot, a worker with room again). */
  changed(model: string): void {
    const q = this.models.get(model);
    if (q !== undefined && q.size > q.trying) this.dispatch(q);
  }

  private dispatch(q: ModelQueue): void {
    // A grant only resolves a waiter's promise: nothing routes before this loop ends, so one count serves it.
    const room = this.fleet.routable(q.model);
    while (q.trying < room) {
      const w = q.next();
      if (!w) return;
      q.trying++;
      w.grant();
    }
  }

  /** A waiter left: an admission frees a turn for the next, at once. */
  left(q: ModelQueue, w: Waiter, why: 'admitted' | 'left' | 'shed'): void {
    const waited = (performance.now() - w.enteredAt) / 1000;
    this.metrics.left(q.model, w.cls, w.ticket.tenant, waited, why);
    this.opts.log.info({ event: 'request_dequeued', model: q.model, tier: w.cls, tenant: w.ticket.tenant, outcome: why, waited_ms: Math.round(waited * 1000), depth: q.size }, `a queued ${w.cls} request for "${q.model}" ${why} after ${Math.round(waited * 1000)} ms`);
    if (q.size === 0) this.models.delete(q.model);
    else if (why === 'admitted') this.dispatch(q);
  }

  expire(q: ModelQueue, w: Waiter): void {
    this.metrics.shed(q.model, 'queue_timeout');
    w.fail(this.shedError(q, `no worker of "${q.model}" could take the request within the queue timeout (${this.opts.timeoutMs} ms)`), 'shed');
  }

  private shed(q: ModelQueue, reason: 'queue_full' | 'expected_wait', message: string): EbbError {
    this.metrics.shed(q.model, reason);
    return this.shedError(q, message);
  }

  /** A shed request's 429: OpenAI's rate_limit_exceeded (the message says why; the shed metric's reason label counts each). */
  private shedError(q: ModelQueue, message: string): EbbError {
    return new EbbError('rate_limit_exceeded', message, { headers: { 'retry-after': String(this.retryAfterS(q.model) ?? Math.ceil(this.opts.timeoutMs / 1000)) } });
  }

  /** Seconds until the queue ahead of a newcomer would have drained at the model's recent admission rate. */
  retryAfterS(model: string): number | undefined {
    const q = this.models.get(model);
    const rate = q?.rate();
    return q === undefined || rate === undefined ? undefined : Math.max(1, Math.ceil((q.size + 1) / rate));
  }

  private withRetryAfter(err: EbbError, model: string): EbbError {
    const s = this.retryAfterS(model);
    if (s !== undefined) err.headers = { ...err.headers, 'retry-after': String(s) };
    return err;
  }
}
