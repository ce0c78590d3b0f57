import { request, errors as undiciErrors, type Agent } from 'undici';
import { capabilitiesNeeded, embeddingNeeds, type Capability } from '../../protocol/capabilities.js';
import { EbbError } from '../../protocol/errors.js';
import { PREFILL_TOKENS_HEADER, ROUTED_BY_HEADER } from '../../protocol/kv-events.js';
import type { WorkerMode } from '../../discovery/discovery.js';
import type { EmbedBody, EmbedResponse, GenerateBody, KvTransferRef, PrefillResponse, StreamLine } from '../../protocol/request-plane.js';
import type { FrontendMetrics } from '../metrics.js';
import { NOTHING_SKIPPED, type PoolWorker, type WorkerPool } from '../routing/worker-pool.js';
import { Router, type RouteHint } from '../routing/router.js';
import { createUpstreamAgent, registerWaitingGauge } from './upstream-agent.js';
import { MAX_ERROR_BODY, StreamLineTooLong, WorkerCall, type BatchLine } from './worker-call.js';
import { IdleWatch } from './idle-watch.js';
import { actOn, brokeBeforeFirstToken, isConnectFailure, KvTransferLost, noServingWorker, rejectNon200, TryElsewhere, unavailableModel, WorkerUnresponsive } from './worker-answer.js';
import { workerAnswer } from '../../protocol/worker-answers.js';
import { WorkerLosses } from './worker-losses.js';
import { readBounded } from '../../common/bounded-read.js';
import type { AdmissionQueue } from '../admission/admission-queue.js';
import type { Place } from '../admission/waiter.js';
import { endAttempt, routeExplain, startAttempt } from '../../tracing/frontend-spans.js';
import { inheritTrace } from '../../tracing/request-trace.js';

/** Refusals and pre-first-token failures are re-routed with their own budget, per serving stage. */
export const MAX_ATTEMPTS = 6;

/** Sends one attempt to `worker` with the request-plane `headers` (the token; with tracing, the attempt's traceparent). */
type Send<T> = (worker: PoolWorker, headers: Record<string, string>, hint?: RouteHint) => Promise<T>;

/**
 * One admitted request on one worker, with its first batch already read (so nothing is sent to the
 * client before a worker has produced a token). Lines come in batches, one per network read: the
 * relay turns a batch into one write, which is what keeps the per-token cost low.
 */
export interface UpstreamStream {
  worker: PoolWorker;
  readonly first: BatchLine[];
  /** The rest of the body: piped into a sink, held while the client is not keeping up. */
  body: Pick<WorkerCall, 'pipe' | 'holdReads' | 'resumeReads'>;
  /** Ends the frontend's accounting of this worker's in-flight request; idempotent. */
  release(): void;
  /** Settles once the worker's response body is done with: true when it ended normally, false when it was cut. */
  closed: Promise<boolean>;
}

const generateUrls = new Map<string, { origin: string; path: string }>();

/** A worker's /generate as the dispatcher takes it; parsed once per request URL, not per request. */
function generateUrl(requestUrl: string): { origin: string; path: string } {
  let u = generateUrls.get(requestUrl);
  if (!u) {
    const url = new URL(`${requestUrl.replace(/\/+$/, '')}/generate`);
    u = { origin: url.origin, path: url.pathname + url.search };
    if (generateUrls.size > 100_000) generateUrls.clear(); // a bound for fleets that churn addresses
    generateUrls.set(requestUrl, u);
  }
  return u;
}

/**
 * Talks to workers over a keep-alive pool. Every call goes through `route`, which keeps trying
 * workers of the right mode until one accepts: a refusal (worker_draining / worker_overloaded), a
 * refused connection, or a worker that dies before its first token all move the request to another
 * worker without the client noticing.
 */
export interface UpstreamOptions {
  /** How long a worker may take to answer /generate's headers (default 10 s). */
  headersTimeoutMs?: number | undefined;
  /** Request-plane bearer token, sent on every call to a worker's request plane. */
  requestToken?: string | undefined;
  /**
   * Connections per worker; unset or 0: as many as there are requests (the worker's admission is
   * the limit). A cap makes requests past it wait, counted in ebb_frontend_upstream_waiting_requests.
   */
  connections?: number | undefined;
  /**
   * A committed stream with no bytes for this long gets its worker's /live probed; when that does
   * not answer either, the worker is hung and the stream moves on (default 10 s; 0 disables).
   */
  streamIdleTimeoutMs?: number | undefined;
  /**
   * How long a prefill worker may take to answer POST /prefill, which it does once the prompt's KV
   * is computed (default 30 s; 0: no bound). Past it the worker counts as hung and the prefill
   * moves to another prefill worker. An embedding (POST /embed, answered once computed) likewise.
   */
  prefillTimeoutMs?: number | undefined;
  /** Chooses the worker for each attempt (default: least in-flight). */
  router?: Router | undefined;
  /** Where requests no worker can take now wait (--queue-timeout); none: they are answered 503 at once. */
  admission?: AdmissionQueue | undefined;
  /**
   * This frontend's name on the request plane (the kv router's): each /generate carries it, and the
   * prefill predicted for it, so the workers tell the other frontends what it routed (KvLoad).
   */
  routedBy?: string | undefined;
}

/**
 * The no-worker answers of rounds in which a worker failed the request (not a refusal, not a
 * hand-off at a drain deadline): a request taken and failed this way MAX_ATTEMPTS turns running is
 * answered instead of queued again (refusals and hand-offs wait on: their workers are busy or
 * draining, not failing).
 */
const failedRounds = new WeakSet<EbbError>();

function isFailure(err: TryElsewhere): boolean {
  return err.hold !== 'draining' && err.hold !== 'overloaded' && workerAnswer(err.outcome).follow !== true && err.outcome !== 'handed_off' && err.outcome !== 'request_handed_off';
}

/** `err`, remembered as a round a worker failed when `failed`. */
function roundEnd(err: EbbError, failed: boolean): EbbError {
  if (failed) failedRounds.add(err);
  return err;
}

/** A prompt's KV takes seconds on a slow engine, rarely more; a prefill silent this long is hung. */
export const DEFAULT_PREFILL_TIMEOUT_MS = 30_000;

/** A prefill's answer names a transfer: a few hundred bytes. */
const MAX_PREFILL_ANSWER = 64 * 1024;

function parseOr(fallback: unknown, text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return fallback;
  }
}

/** What a queued request needs of a worker (its adapter, room for flex, capabilities, workers it skips): its need in the queue. */
function needOf(adapter: string | undefined, flex: boolean, needs: readonly Capability[], skip: ReadonlySet<string>): string {
  return JSON.stringify([adapter ?? null, flex, needs, skip.size === 0 ? [] : [...skip]]);
}

/** Vectors as base64 float32: 2048 inputs of 4096 dimensions take 45 MB. */
const MAX_EMBED_ANSWER = 128 * 1024 * 1024;

/** How long releasing an unclaimed KV transfer may take; it expires on the prefill side anyway. */
const KV_RELEASE_TIMEOUT_MS = 2000;

/**
 * Talks to workers over a keep-alive pool. Every call goes through `route`, which keeps trying
 * workers of the right mode until one accepts: a refusal (worker_draining / worker_overloaded), a
 * refused connection, or a worker that dies before its first token all move the request to another
 * worker without the client noticing.
 */
export class Upstream {
  readonly agent: Agent;
  private readonly headersTimeoutMs: number;
  private readonly prefillTimeoutMs: number;
  private readonly idle: IdleWatch;
  private readonly headers: Record<string, string>;
  private readonly generateHeaders: Record<string, string>;
  readonly router: Router;
  private readonly admission: AdmissionQueue | undefined;

  /**
   * `headersTimeoutMs` bounds how long a worker may take to answer /generate's headers, which it
   * sends right after admission, before any token: a worker silent past it is hung (stopped, stuck)
   * and the request moves on. Tokens themselves have no deadline: a long stream is not a hang.
   */
  constructor(
    private readonly pool: WorkerPool,
    private readonly metrics: FrontendMetrics,
    opts: UpstreamOptions = {},
  ) {
    this.headersTimeoutMs = opts.headersTimeoutMs ?? 10_000;
    this.prefillTimeoutMs = opts.prefillTimeoutMs ?? DEFAULT_PREFILL_TIMEOUT_MS;
    this.headers = opts.requestToken === undefined ? {} : { authorization: `Bearer ${opts.requestToken}` };
    this.generateHeaders = { 'content-type': 'application/json', ...this.headers, ...(opts.routedBy !== undefined && { [ROUTED_BY_HEADER]: opts.routedBy }) };
    this.agent = createUpstreamAgent(opts.connections);
    this.router = opts.router ?? new Router(pool, { kind: 'least-loaded' });
    this.admission = opts.admission;
    registerWaitingGauge(metrics.registry, this.agent);
    this.idle = new IdleWatch(this.agent, pool, opts.streamIdleTimeoutMs ?? 10_000);
  }

  /**
   * One try on one worker, counted in its in-flight until the returned release. Failures come out
   * classified: EbbError (the client's answer), KvTransferLost, the abort itself, or TryElsewhere
   * (with the worker held out when the failure says it should be).
   */
  private async tryOn<T>(worker: PoolWorker, signal: AbortSignal, send: Send<T>, hint?: RouteHint, flex = false, traced?: object, path = '/generate', losses?: WorkerLosses): Promise<{ worker: PoolWorker; value: T; release: () => void }> {
    const id = worker.record.worker_id;
    const release = this.pool.acquire(worker, flex);
    // A refusal the worker's room overtook (a request on it ended, it said so) holds it out for nothing.
    const sentAt = this.pool.roomMark;
    // Its uncached prompt is queued prefill on the worker until the first token (or the failure).
    const prefilled = this.router.begin(worker, hint);
    // Tracing on: a span per attempt, its traceparent in the headers the worker gets.
    const attempt = startAttempt(traced, worker.record, path, this.generateHeaders);
    try {
      const value = await send(worker, attempt?.headers ?? this.generateHeaders, hint);
      prefilled();
      this.router.routed(worker, hint);
      this.metrics.attempt(id, 'routed');
      if (attempt) endAttempt(attempt, 'routed');
      return { worker, value, release };
    } catch (err) {
      prefilled();
      release(false);
      if (signal.aborted) {
        if (attempt) endAttempt(attempt, 'cancelled', err);
        throw err;
      }
      if (err instanceof EbbError || err instanceof KvTransferLost) {
        const outcome = err instanceof KvTransferLost ? 'kv_transfer_lost' : 'client_error';
        this.metrics.attempt(id, outcome);
        if (attempt) endAttempt(attempt, err instanceof EbbError ? err.code : outcome, err);
        throw err;
      }
      const failure = err instanceof TryElsewhere ? err : new TryElsewhere(isConnectFailure(err) ? 'unreachable' : 'failed_before_first_token', isConnectFailure(err) ? 'unreachable' : undefined);
      // A flex refusal says only that the worker's free slots are its priority reserve: other tiers still go to it.
      if (flex && failure.hold === 'overloaded') this.pool.holdFlex(id, Date.now(), sentAt);
      else if (failure.hold) this.pool.hold(id, failure.hold, Date.now(), failure.retryAfterS, sentAt);
      else if (workerAnswer(failure.outcome).follow) this.pool.follow(id);
      this.metrics.attempt(id, failure.outcome);
      if (attempt) endAttempt(attempt, failure.outcome, err);
      // A worker that broke under the request: the second such ends it here (worker-losses.ts).
      if (failure.broke !== undefined) losses?.record(id, failure.broke);
      throw failure;
    }
  }

  private noWorker(model: string, mode: WorkerMode, lastRefusal: string | undefined): EbbError {
    if (!this.pool.hasModel(model)) return unavailableModel(this.pool, model);
    return noServingWorker(
      lastRefusal ? `no ${mode} worker could take the request (last answer: ${lastRefusal}); retry shortly` : `no serving ${mode} worker for "${model}" is reachable; retry shortly`,
      this.pool.retryAfterS(model),
    );
  }

  /**
   * `attempt` now when nobody of its model is queued; else, and when it finds no worker, through
   * the admission queue: it waits for a turn and tries again, from the workers it was first told to
   * skip (a migration's), until a worker takes it or the queue answers (429, or 503 when waiting
   * cannot help). `need`: what it needs of a worker (waiters that need alike are refused alike);
   * `drop`: frees what a worker took for a request whose client left while it tried. Without a
   * queue it is `attempt` itself.
   */
  private async queued<T>(body: { model: string }, signal: AbortSignal, tried: Set<string>, need: (skip: ReadonlySet<string>) => string, attempt: (admitted?: () => void) => Promise<T>, drop: (won: T) => void): Promise<T> {
    const queue = this.admission;
    if (queue === undefined) return attempt();
    // What the request was told to skip before any attempt (a continuation: the worker it leaves).
    const skip: ReadonlySet<string> = tried.size === 0 ? NOTHING_SKIPPED : new Set(tried);
    let place: Place | undefined;
    // Turns in which a worker took the request and failed it before a token (failedRounds): a request every worker fails is answered, not queued for ever.
    let failedTurns = 0;
    if (queue.waitingBefore(body) === 0) {
      try {
        return await attempt();
      } catch (err) {
        if (!(err instanceof EbbError && err.code === 'no_serving_worker') || signal.aborted) throw err;
        place = await queue.enter(body, signal, err, need(skip), skip);
      }
    } else place = await queue.enter(body, signal, noServingWorker(`no worker of "${body.model}" can take the request`), need(skip), skip);
    for (;;) {
      await place.turn();
      tried.clear();
      for (const id of skip) tried.add(id);
      // A worker's 200 is its admission: the next in line gets its turn then, not a first token later.
      let out = false;
      const current = place;
      const admitted = () => {
        if (out) return;
        out = true;
        current.admitted();
      };
      let won: T;
      try {
        won = await attempt(admitted);
      } catch (err) {
        if (!(err instanceof EbbError && err.code === 'no_serving_worker') || signal.aborted) {
          if (!out) place.leave();
          throw err;
        }
        // Out of the queue already (its worker took it, then failed before a token): in again, at the back.
        if (out) {
          if (failedRounds.has(err) && ++failedTurns >= MAX_ATTEMPTS) throw noServingWorker(`workers of "${body.model}" took the request ${failedTurns} times and failed before its first token each time (${err.message})`, this.pool.retryAfterS(body.model));
          place = await queue.enter(body, signal, err, need(skip), skip);
        } else place.refused();
        continue;
      }
      admitted();
      // Its client left while it tried: the queue let it go then, and nobody is there for the answer.
      if (current.clientGone !== undefined) {
        drop(won);
        throw current.clientGone;
      }
      return won;
    }
  }

  private async route<T>(
    model: string,
    mode: WorkerMode,
    signal: AbortSignal,
    tried: Set<string>,
    send: Send<T>,
    needs: readonly Capability[] = [],
    body?: GenerateBody,
    /** The request body whose trace the attempts join (tracing on); its path on the worker. */
    traced: object | undefined = body,
    path = '/generate',
    losses?: WorkerLosses,
  ): Promise<{ worker: PoolWorker; value: T; release: () => void }> {
    let lastRefusal: string | undefined;
    let failed = false;
    // The prompt's blocks, once for every attempt (the router scores the eligible workers by them).
    const flex = body?.service_tier === 'flex';
    if (flex) this.pool.skipFlexHeld(model, mode, tried);
    const hint = body === undefined || this.router.kind !== 'kv' ? undefined : await this.router.prepare(body, mode, tried, needs);
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
      if (signal.aborted) throw signal.reason;
      const worker = this.router.pick(model, mode, tried, needs, hint, body?.adapter, routeExplain(traced, model, mode));
      if (!worker) break;
      tried.add(worker.record.worker_id);
      try {
        return await this.tryOn(worker, signal, send, hint, flex, traced, path, losses);
      } catch (err) {
        if (err instanceof KvTransferLost) tried.delete(worker.record.worker_id); // the worker is fine; the KV is what is gone
        if (!(err instanceof TryElsewhere)) throw err;
        if (err.said !== undefined) lastRefusal = err.said;
        failed ||= isFailure(err);
        // Handed off before its first token (its worker reached a drain deadline with it queued): the
        // request starts afresh from that worker, as a migration does, so a worker passed over earlier
        // (the one it left, serving again after a restart) may take it.
        if (err.outcome === 'handed_off' || err.outcome === 'request_handed_off') {
          tried.clear();
          tried.add(worker.record.worker_id);
        }
      }
    }
    throw roundEnd(this.noWorker(model, mode, lastRefusal), failed);
  }

  /**
   * POST {path} on `w` whose answer is one JSON body, sent once the work is done (/prefill: the
   * prompt's KV computed; /embed: every vector), so the whole call is bounded by the prefill
   * timeout. A worker silent past it is hung: undici destroys the socket (the worker sees its caller
   * leave), and the attempt fails as that worker's, held out like an unreachable one.
   */
  private async postForAnswer<T>(w: PoolWorker, path: '/prefill' | '/embed', body: unknown, signal: AbortSignal, maxAnswer: number, headers = this.generateHeaders): Promise<T> {
    const timeout = this.prefillTimeoutMs;
    try {
      const res = await request(`${w.record.request_url}${path}`, {
        method: 'POST',
        headers,
        body: JSON.stringify(body),
        dispatcher: this.agent,
        signal,
        headersTimeout: timeout,
        bodyTimeout: timeout,
      });
      if (res.statusCode !== 200) rejectNon200(w.record.worker_id, res.statusCode, parseOr({}, await readBounded(res.body, MAX_ERROR_BODY, { cut: true })), res.headers['retry-after']);
      return JSON.parse(await readBounded(res.body, maxAnswer, { what: `worker ${w.record.worker_id}'s ${path.slice(1)} answer` })) as T;
    } catch (err) {
      if (err instanceof undiciErrors.HeadersTimeoutError || err instanceof undiciErrors.BodyTimeoutError) throw new TryElsewhere('prefill_timeout', 'unreachable', undefined, undefined, brokeBeforeFirstToken(err));
      const broke = brokeBeforeFirstToken(err);
      if (broke !== undefined) throw new TryElsewhere('unreachable', 'unreachable', undefined, undefined, broke);
      throw err;
    }
  }

  /**
   * POST /generate on `w`, up to its first batch of lines; `admitted` is told when the worker took it
   * (its 200, before any token). With the kv router's prediction (`hint`), the prompt tokens it must prefill go with it.
   */
  private async generate(w: PoolWorker, body: GenerateBody, signal: AbortSignal, admitted?: () => void, headers = this.generateHeaders, hint?: RouteHint) {
    const url = generateUrl(w.record.request_url);
    const prefill = this.router.prefillOn(w, hint);
    const call = WorkerCall.start(
      this.agent,
      {
        origin: url.origin,
        path: url.path,
        method: 'POST',
        headers: prefill === undefined ? headers : { ...headers, [PREFILL_TOKENS_HEADER]: String(prefill) },
        // A worker whose engine cannot pause a sequence (or of an ebb before preemption) is not told it may.
        body: JSON.stringify(body.preemptible === true && w.record.capabilities?.preemption !== true ? { ...body, preemptible: undefined } : body),
        headersTimeout: this.headersTimeoutMs,
        bodyTimeout: 0,
      },
      signal,
    );
    let status: number;
    try {
      status = await call.head;
    } catch (err) {
      // Sent and never answered, or its connection closed with the request on it: a loss (a refused connection is not).
      const broke = brokeBeforeFirstToken(err);
      if (broke === undefined) throw err;
      throw new TryElsewhere(isConnectFailure(err) ? 'unreachable' : 'failed_before_first_token', isConnectFailure(err) ? 'unreachable' : undefined, undefined, undefined, broke);
    }
    if (status !== 200) rejectNon200(w.record.worker_id, status, await call.json(), call.retryAfter);
    admitted?.();
    // Watched from here: a worker that hangs before its first token is as hung as one after.
    const stopWatch = this.idle.watch(w, call);
    let first: IteratorResult<BatchLine[], void>;
    try {
      first = await call.next();
    } catch (err) {
      stopWatch();
      call.abort();
      // The answer's own token is past the bound, not the worker at fault: any worker would send it again.
      if (err instanceof StreamLineTooLong) throw new EbbError('worker_protocol_error', `worker ${w.record.worker_id} sent ${err.message}, which the frontend cannot relay (not tried elsewhere: any worker would send it again)`);
      // It had taken the request (its 200 came): whatever ended it now is a loss.
      const broke = brokeBeforeFirstToken(err) ?? `it failed before its first token (${(err as Error).message})`;
      if (err instanceof WorkerUnresponsive) throw new TryElsewhere('unresponsive', 'unreachable', undefined, undefined, broke);
      throw new TryElsewhere(isConnectFailure(err) ? 'unreachable' : 'failed_before_first_token', isConnectFailure(err) ? 'unreachable' : undefined, undefined, undefined, broke);
    }
    // Nothing has reached the client yet: another worker can still serve it whole, unless the
    // worker said the request itself is at fault (the table's answer, as for a non-200).
    if (first.done || first.value.some((line) => 'error' in line || 'handoff' in line)) {
      stopWatch();
      call.abort();
      const refused = first.value?.find((line): line is Extract<StreamLine, { error: unknown }> => 'error' in line);
      if (refused) actOn(w.record.worker_id, 200, refused.error);
      if (first.value?.some((line) => 'handoff' in line)) throw new TryElsewhere('handed_off');
      throw new TryElsewhere('failed_before_first_token', undefined, undefined, undefined, 'it closed the stream before its first token');
    }
    return { first: first.value, call, stopWatch };
  }

  /**
   * The stream as handed to the relay. Releasing a stream that got its final line lets the body end
   * on its own (no abort, the socket stays pooled); one that did not is destroyed, which is what
   * frees the worker's slot.
   */
  private stream(worker: PoolWorker, value: Awaited<ReturnType<Upstream['generate']>>, release: () => void): UpstreamStream {
    let done = false;
    const { call } = value;
    const end = () => {
      if (done) return;
      done = true;
      value.stopWatch();
      if (!call.final) call.abort();
      release();
    };
    return { worker, first: value.first, body: call, release: end, closed: call.closed };
  }

  /**
   * Opens a token stream on the model's serving path as it is at each try: an aggregated worker, or a
   * prefill+decode pair (pair). Chosen per turn, not once: a request that waited for a model whose
   * workers were all loading or restarting may find it come up disaggregated.
   */
  openServing(body: GenerateBody, signal: AbortSignal, tried: Set<string> = new Set(), losses?: WorkerLosses): Promise<UpstreamStream> {
    const needs = capabilitiesNeeded(body);
    return this.queued(
      body,
      signal,
      tried,
      (skip) => needOf(body.adapter, body.service_tier === 'flex', needs, skip),
      async (admitted) => {
        if (this.pool.servingPath(body.model) === 'disaggregated') return this.pair(body, signal, tried, losses);
        const { worker, value, release } = await this.route(body.model, 'aggregated', signal, tried, (w, headers, hint) => this.generate(w, body, signal, admitted, headers, hint), needs, body, body, '/generate', losses);
        return this.stream(worker, value, release);
      },
      (won) => won.release(),
    );
  }

  /** Opens a token stream on a worker of `mode`. */
  async open(body: GenerateBody, mode: WorkerMode, signal: AbortSignal, tried: Set<string> = new Set(), losses?: WorkerLosses): Promise<UpstreamStream> {
    const needs = capabilitiesNeeded(body);
    const { worker, value, release } = await this.queued(
      body,
      signal,
      tried,
      (skip) => needOf(body.adapter, body.service_tier === 'flex', needs, skip),
      (admitted) => this.route(body.model, mode, signal, tried, (w, headers, hint) => this.generate(w, body, signal, admitted, headers, hint), needs, body, body, '/generate', losses),
      (won) => this.stream(won.worker, won.value, won.release).release(),
    );
    return this.stream(worker, value, release);
  }

  /**
   * POST /embed on a worker of the model that embeds (and takes token ids, for id inputs): refusals,
   * unreachable and hung workers move it to the next one, as a generation before its first token.
   * A disaggregated model's decode workers serve it (they hold whole models; prefill workers hand off KV).
   */
  async embed(body: EmbedBody, signal: AbortSignal): Promise<{ worker: PoolWorker; answer: EmbedResponse }> {
    // The path as it is at each turn (see openServing).
    const mode = (): WorkerMode => (this.pool.servingPath(body.model) === 'aggregated' ? 'aggregated' : 'decode');
    const send: Send<EmbedResponse> = (w, headers) => this.postForAnswer<EmbedResponse>(w, '/embed', body, signal, MAX_EMBED_ANSWER, headers);
    const tried = new Set<string>();
    // It waits in its model's queue as a generation does (its ticket: the header's tier, its inputs' tokens).
    const needs = embeddingNeeds(body);
    const { worker, value, release } = await this.queued(
      body,
      signal,
      tried,
      (skip) => needOf(undefined, false, needs, skip),
      () => this.route(body.model, mode(), signal, tried, send, needs, undefined, body, '/embed', new WorkerLosses()),
      (won) => won.release(),
    );
    release();
    return { worker, answer: value };
  }

  /** Frees a transfer nobody will pull (204, or 404 when it was pulled or expired); never throws. */
  async releaseKv(kv: KvTransferRef): Promise<void> {
    try {
      const res = await request(`${kv.source_url}/kv/${encodeURIComponent(kv.transfer_id)}`, {
        method: 'DELETE',
        headers: this.headers,
        dispatcher: this.agent,
        signal: AbortSignal.timeout(KV_RELEASE_TIMEOUT_MS),
      });
      await res.body.dump();
    } catch {
      /* unreachable prefill worker: the transfer expires there on its own */
    }
  }

  /** The next decode worker for this request, counted as taken (while its prefill runs, too), or undefined. */
  private reserveDecode(model: string, tried: Set<string>, needs: readonly Capability[], adapter?: string, flex = false): { worker: PoolWorker; release: () => void } | undefined {
    if (flex) this.pool.skipFlexHeld(model, 'decode', tried);
    const worker = this.pool.pick(model, 'decode', tried, needs, undefined, adapter);
    if (!worker) return undefined;
    tried.add(worker.record.worker_id);
    // A reservation frees no slot the worker used (the request it makes holds its own count).
    const release = this.pool.acquire(worker);
    return { worker, release: () => release(false) };
  }

  /**
   * Disaggregated serving (one turn of openServing): a prefill worker computes the prompt's KV, then a decode worker pulls it
   * and streams. A decode worker is picked (and counted) before any prefill: with none, no KV is
   * computed for nobody. A decode worker that refuses leaves the KV unclaimed, so the next decode
   * worker gets the same transfer; when no decode worker takes it (or the client left), the transfer
   * is released on the prefill worker at once, so it never holds that worker's drain until its TTL.
   * A decode worker that lost the KV (died after pulling it, or it expired) leaves nothing for the
   * next one, so the pair is redone (a fresh prefill). With no prefill worker that can take it
   * (drained, gone, all refusing), the decode worker evaluates the prompt itself, as it does when a
   * pull fails: slower, never a 503 while a decode worker serves.
   */
  private async pair(body: GenerateBody, signal: AbortSignal, tried: Set<string>, losses?: WorkerLosses): Promise<UpstreamStream> {
    let lastRefusal: string | undefined;
    let failed = false;
    // The decode worker generates: it is the one that must honour what the request needs.
    const needs = capabilitiesNeeded(body);
    const flex = body.service_tier === 'flex';
    for (let pair = 1; ; pair++) {
      if (signal.aborted) throw signal.reason;
      let decode = this.reserveDecode(body.model, tried, needs, body.adapter, flex);
      if (!decode) throw roundEnd(this.noWorker(body.model, 'decode', lastRefusal), failed);
      let kv: KvTransferRef | undefined;
      try {
        // The prefill worker is the one that computes the prompt: chosen by what it holds, too.
        const prefill = await this.route(body.model, 'prefill', signal, new Set(), (w, headers) => this.postForAnswer<PrefillResponse>(w, '/prefill', body, signal, MAX_PREFILL_ANSWER, headers), [], body, body, '/prefill', losses);
        prefill.release();
        const { transfer_id, source_url, worker_id, cached_tokens } = prefill.value;
        kv = { transfer_id, source_url, worker_id, ...(cached_tokens !== undefined ? { cached_tokens } : {}) };
      } catch (err) {
        if (!(err instanceof EbbError && err.code === 'no_serving_worker')) {
          decode.release();
          throw err;
        }
      }
      const sent = kv === undefined ? body : { ...body, kv_transfer: kv };
      inheritTrace(sent, body);
      let lost = false;
      for (let attempt = 1; decode; attempt++) {
        const { worker, release: reserved } = decode;
        decode = undefined;
        try {
          const { value, release } = await this.tryOn(worker, signal, (w, headers) => this.generate(w, sent, signal, undefined, headers), undefined, flex, sent, '/generate', losses);
          return this.stream(worker, value, release);
        } catch (err) {
          if (err instanceof KvTransferLost) {
            tried.delete(worker.record.worker_id); // the worker is fine; the KV is what is gone
            lost = true;
          } else if (err instanceof TryElsewhere) {
            if (err.said !== undefined) lastRefusal = err.said;
            failed ||= isFailure(err);
            if (attempt < MAX_ATTEMPTS && !signal.aborted) decode = this.reserveDecode(body.model, tried, needs, body.adapter, flex);
          }
          if (!decode && kv !== undefined) await this.releaseKv(kv);
          if (!(err instanceof TryElsewhere) && !lost) throw err;
        } finally {
          reserved();
        }
      }
      if (!lost) throw roundEnd(this.noWorker(body.model, 'decode', lastRefusal), failed);
      if (pair >= MAX_ATTEMPTS) throw noServingWorker(`decode workers could not take the KV of "${body.model}" requests; retry shortly`, this.pool.retryAfterS(body.model));
    }
  }

  async close(): Promise<void> {
    await this.agent.close();
  }
}
