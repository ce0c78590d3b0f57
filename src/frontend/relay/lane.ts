import type { Logger } from 'pino';
import { EbbError } from '../../protocol/errors.js';
import type { GenerateBody, KvTransferRef, StreamLine, Usage } from '../../protocol/request-plane.js';
import type { FrontendMetrics } from '../metrics.js';
import { Delivered, type MigrationReason } from './migration.js';
import type { UpstreamStream } from './upstream.js';
import { brokeMidStream, HandedOff, MidStreamFailure, StreamCut, WorkerStreamError, WorkerUnresponsive } from './worker-answer.js';
import { WorkerLosses } from './worker-losses.js';
import { tagPreempted } from '../admission/ticket.js';
import { feedLines, StreamLineTooLong, type BatchLine, type TokenSink } from './worker-call.js';
import { endMigration, startMigration } from '../../tracing/frontend-spans.js';
import { bodyLogIds, inheritTrace } from '../../tracing/request-trace.js';

/** Where a lane's tokens go: the client's stream writer, or a collector for a non-streaming answer. */
export interface LaneSink extends TokenSink {
  /** The upstream body feeding the sink from now on (a client that does not keep up holds its reads). */
  follow?(body: UpstreamStream['body']): void;
  /** Writes what is pending; before a continuation, the tokens read before the break go out first. */
  flush?(): void;
}

/** Opens a request on a serving worker of its model (aggregated or disaggregated), skipping `tried`. */
export type OpenUpstream = (gen: GenerateBody, signal: AbortSignal, tried: Set<string>, losses: WorkerLosses) => Promise<UpstreamStream>;

export interface LaneContext {
  open: OpenUpstream;
  metrics: FrontendMetrics;
  log: Logger;
  /** How many times one sequence may move to another worker mid-stream; 0 disables. */
  migrationLimit: number;
  /** How many times a flex sequence may be paused for a priority request (--preemption-limit); 0: never. */
  preemptionLimit: number;
  /** Frees a hand-off's KV state nobody will continue from (else it holds its worker's drain until its TTL). */
  releaseKv?: ((kv: KvTransferRef) => Promise<void>) | undefined;
}

/** A lane that could not be finished: the failure the whole response ends with. */
export class LaneFailed extends Error {
  constructor(readonly failure: MidStreamFailure) {
    super(failure.message);
  }
}

/**
 * What one sequence had delivered when its frontend went away: its text, and its tokens as counted
 * then; `done` when it had already finished (its finish event waits for the response's end).
 */
export interface Resumed {
  text: string;
  tokens: number;
  done?: LaneDone | undefined;
}

/** How a lane finished: the reason, and the usage of the whole sequence across its workers. */
export interface LaneDone {
  finishReason: string;
  usage: Usage;
}

/**
 * One sequence of a response (a choice), from its first worker to whichever finishes it: the one
 * owner of its upstream stream, of what it delivered, of its sink and of its migration loop. Its
 * upstream is released exactly once however the lane ends (finished, failed, client gone, moved):
 * by the lane when it moves on, by close() otherwise; a worker taken after close() is released at
 * once.
 */
export class Lane {
  readonly delivered: Delivered;
  /** The lines read when the worker was taken, not yet fed to a sink (its terminal line, when among them). */
  private pending: BatchLine[];
  private sink: LaneSink | undefined;
  private closed = false;
  /** Times a worker paused it for a priority request (bounded by the context's preemptionLimit). */
  private preemptions = 0;

  private constructor(
    readonly index: number,
    private readonly gen: GenerateBody,
    private readonly ctx: LaneContext,
    private up: UpstreamStream,
    /** The workers the sequence broke, before its first token and since: a second one ends it (worker-losses.ts). */
    private readonly losses: WorkerLosses,
    delivered?: Delivered,
  ) {
    this.delivered = delivered ?? new Delivered();
    this.pending = up.first;
  }

  /** Takes a worker for the sequence; nothing is sent to the client yet. */
  static async open(index: number, gen: GenerateBody, ctx: LaneContext, signal: AbortSignal): Promise<Lane> {
    const losses = new WorkerLosses();
    preemptible(gen, ctx.preemptionLimit > 0);
    return new Lane(index, gen, ctx, await ctx.open(gen, signal, new Set(), losses), losses);
  }

  /** A sequence another frontend started and can no longer finish (a takeover): continued from what it delivered. */
  static async resume(index: number, gen: GenerateBody, ctx: LaneContext, signal: AbortSignal, from: Resumed): Promise<Lane> {
    const delivered = new Delivered();
    delivered.restore(from.text, from.tokens);
    preemptible(gen, ctx.preemptionLimit > 0);
    const body = delivered.continuation(gen);
    inheritTrace(body, gen);
    const losses = new WorkerLosses();
    return new Lane(index, gen, ctx, await ctx.open(body, signal, new Set(), losses), losses, delivered);
  }

  /** The worker serving the lane now. */
  get workerId(): string {
    return this.up.worker.record.worker_id;
  }

  /** The worker's done line is already read (the answer came whole with the first read): run() finishes without waiting. */
  get answered(): boolean {
    const last = this.pending[this.pending.length - 1];
    return last !== undefined && 'done' in last;
  }

  /** Feeds the lines read so far into `sink`, which gets the lane's tokens from now on. */
  start(sink: LaneSink): void {
    this.sink = sink;
    this.feedPending(sink);
  }

  /**
   * Relays the lane into its sink until the sequence is done, continuing it on another worker
   * (from what was delivered) when its worker fails or hands it off. Throws LaneFailed, with why,
   * when no worker can continue it, or the abort when `signal` aborts.
   */
  async run(signal: AbortSignal): Promise<LaneDone> {
    const sink = this.sink!;
    for (;;) {
      try {
        sink.follow?.(this.up.body);
        const end = this.feedPending(sink) ?? (await this.up.body.pipe(sink));
        if (end !== undefined && 'done' in end) return { finishReason: end.finish_reason, usage: this.delivered.usage(end.usage) };
        sink.flush?.();
        throw end === undefined ? new StreamCut() : this.endOf(end);
      } catch (err) {
        // Closed (the response ended: another lane failed, the client left): nothing to move.
        if (signal.aborted || this.closed || err instanceof LaneFailed) {
          // A state exported for a hand-off nobody continues: free it, or its source waits out the TTL to drain.
          if (err instanceof HandedOff && err.kv !== undefined) void this.ctx.releaseKv?.(err.kv);
          throw err;
        }
        // Tokens read before the break were delivered: the client gets them before the continuation (or the error).
        sink.flush?.();
        // A line the frontend cannot read is the answer's token, not the worker failing: a worker continuing the sequence would send it again.
        if (err instanceof StreamLineTooLong) throw new LaneFailed(new MidStreamFailure(this.workerId, err));
        await this.moveOn(err, signal);
      }
    }
  }

  /** Writes what the lane's sink holds (a client writer's pending events). */
  flush(): void {
    this.sink?.flush?.();
  }

  /** Releases the lane's worker (idempotent); the lane is over. */
  close(): void {
    this.closed = true;
    this.up.release();
  }

  /** The failure a stream that broke under this lane ends with. */
  failure(err: unknown): MidStreamFailure {
    return err instanceof LaneFailed ? err.failure : new MidStreamFailure(this.workerId, err);
  }

  /** The pending text lines into `sink`, once; the terminal line when it is among them (it stays pending). */
  private feedPending(sink: TokenSink): StreamLine | undefined {
    const end = feedLines(this.pending, sink);
    this.pending = end === undefined ? [] : [end];
    return end;
  }

  /** A terminal line other than done: the error the lane's loop ends with. */
  private endOf(line: StreamLine): Error {
    return 'handoff' in line ? new HandedOff(this.workerId, line.handoff.kv, line.handoff.reason === 'preempted' ? 'preempted' : 'drain_deadline') : new WorkerStreamError((line as { error: { code: never; message: string } }).error);
  }

  /**
   * Moves a broken (or handed-off) sequence to another serving worker, which continues from what
   * was delivered; throws LaneFailed with why when none can.
   */
  private async moveOn(err: unknown, signal: AbortSignal): Promise<void> {
    const { metrics, log, migrationLimit } = this.ctx;
    this.up.release();
    const fromId = this.workerId;
    // Paused for a priority request: continued later, on any worker (the one it left too), first among flex; not a migration.
    const preempted = err instanceof HandedOff && err.reason === 'preempted';
    const reason: MigrationReason = preempted ? 'preempted' : err instanceof HandedOff ? 'handoff' : err instanceof WorkerUnresponsive ? 'worker_unresponsive' : 'worker_failed';
    if (preempted) {
      this.preemptions++;
      metrics.preempted();
      log.info({ event: 'stream_preempted', request_id: this.gen.request_id, worker_id: fromId, tokens_delivered: this.delivered.tokens, preemptions: this.preemptions }, `request ${this.gen.request_id} paused on ${fromId} after ${this.delivered.tokens} tokens for a priority request (${this.preemptions} of at most ${this.ctx.preemptionLimit})`);
    }
    const unclaimed = () => (err instanceof HandedOff && err.kv !== undefined ? this.ctx.releaseKv?.(err.kv) : undefined);
    // A worker that broke under it: the second such ends the stream here, before any other worker gets it.
    const broke = brokeMidStream(err);
    if (broke !== undefined) {
      try {
        this.losses.record(fromId, broke);
      } catch (verdict) {
        metrics.migrationFailed('broke_workers');
        throw new LaneFailed(new MidStreamFailure(fromId, err, (verdict as Error).message, 'request_broke_workers'));
      }
    }
    if (!preempted && this.delivered.migrations >= migrationLimit) {
      await unclaimed();
      metrics.migrationFailed('limit');
      const why = migrationLimit === 0 ? 'migration is disabled (--migration-limit 0)' : `the request already moved ${migrationLimit} times (--migration-limit)`;
      throw new LaneFailed(new MidStreamFailure(fromId, err, why));
    }
    // Each move starts afresh, from the worker it leaves: a worker passed over by an earlier move (it
    // handed the stream off while draining, then resumed) may take the stream back.
    let next: UpstreamStream;
    // A pause is no migration: it does not count against --migration-limit.
    const body = this.delivered.continuation(this.gen, !preempted);
    // Tracing on: the move is a span of the request's trace, the next worker's attempts under it.
    const moving = startMigration(this.gen, body, reason, fromId, this.delivered.tokens, this.delivered.migrations);
    try {
      // A hand-off's KV: the next worker loads prompt + delivered tokens instead of re-evaluating them.
      if (err instanceof HandedOff && err.kv !== undefined) body.handoff_kv = err.kv;
      preemptible(body, this.preemptions < this.ctx.preemptionLimit);
      if (preempted) tagPreempted(body);
      next = await this.ctx.open(body, signal, preempted ? new Set() : new Set([fromId]), this.losses);
    } catch (e) {
      if (moving) endMigration(moving, undefined, { code: e instanceof EbbError ? e.code : 'migration_failed', message: (e as Error).message });
      await unclaimed();
      if (signal.aborted) throw e;
      const verdict = e instanceof EbbError && e.code === 'request_broke_workers';
      metrics.migrationFailed(verdict ? 'broke_workers' : e instanceof EbbError && (e.code === 'no_serving_worker' || e.code === 'model_not_found') ? 'no_worker' : 'error');
      throw new LaneFailed(new MidStreamFailure(fromId, err, (e as Error).message, verdict ? 'request_broke_workers' : undefined));
    }
    if (moving) endMigration(moving, next.worker.record.worker_id);
    this.up = next;
    this.pending = next.first;
    // Closed while the worker was being taken (another lane failed, the client left): it is not kept.
    if (this.closed) {
      next.release();
      throw signal.reason ?? new Error('lane closed');
    }
    const toId = this.workerId;
    metrics.migrated(reason);
    log.info(
      { event: 'stream_migrated', request_id: this.gen.request_id, from_worker: fromId, to_worker: toId, tokens_delivered: this.delivered.tokens, reason, ...bodyLogIds(this.gen) },
      `request ${this.gen.request_id} moved from ${fromId} to ${toId} after ${this.delivered.tokens} tokens (${reason})`,
    );
  }
}

/** A flex sequence's body says whether a worker may pause it for a priority request (`allowed`: it has not been paused its limit's times). */
function preemptible(body: GenerateBody, allowed: boolean): void {
  if (allowed && body.service_tier === 'flex') body.preemptible = true;
  else delete body.preemptible;
}

/**
 * Takes a worker for every sequence before anything is committed to the client: a refusal is still
 * a JSON error. When one cannot be taken, the others are closed and its error is thrown.
 */
export async function openLanes(gens: GenerateBody[], ctx: LaneContext, signal: AbortSignal, resumed?: Resumed[]): Promise<Lane[]> {
  const open = (gen: GenerateBody, index: number) => (resumed === undefined ? Lane.open(index, gen, ctx, signal) : Lane.resume(index, gen, ctx, signal, resumed[index]!));
  if (gens.length === 1) return resumed?.[0]?.done === undefined ? [await open(gens[0]!, 0)] : [];
  // A takeover opens only the sequences that had not finished.
  const opened = await Promise.allSettled(gens.flatMap((gen, index) => (resumed?.[index]?.done === undefined ? [open(gen, index)] : [])));
  const failed = opened.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failed) {
    for (const r of opened) if (r.status === 'fulfilled') r.value.close();
    throw failed.reason;
  }
  return opened.map((r) => (r as PromiseFulfilledResult<Lane>).value);
}
