import type { Logger } from 'pino';
import type { LaneDone, Resumed } from '../relay/lane.js';
import type { Delivered } from '../relay/migration.js';
import { CopyGate } from './copy-gate.js';
import { ProgressMarks } from './stream-progress.js';
import { streamKeys, type StepAnswer } from './shared-protocol.js';

type Keys = ReturnType<typeof streamKeys>;

/** The atomic steps a lease takes in the store (SharedStreams runs them), and the batch timer it is flushed by. */
export interface SharedSteps {
  readonly healthy: boolean;
  /** Since when the store has answered without a break (performance.now()). */
  readonly healthySince: number;
  /**
   * Flushes `lease` with the next batch: `now` at the end of this turn of the event loop (its last
   * batch answered and at least BATCH_MS old), else within BATCH_MS (on one timer for all streams).
   */
  schedule(lease: StreamLease, now?: boolean): void;
  /** A stream handed on before its first batch: opened alone (its first batch opens it otherwise). */
  openEmpty(k: Keys, token: string, bounds: LeaseBounds, opening: Opening): Promise<StepAnswer>;
  /** `opening`: the stream's first step, which opens it too. */
  append(k: Keys, token: string, bounds: LeaseBounds, batch: number, events: Buffer, progress: string, opening?: Opening): Promise<StepAnswer>;
  renew(k: Keys, token: string, bounds: LeaseBounds): Promise<StepAnswer>;
  finish(k: Keys, token: string, bounds: LeaseBounds, batch: number, kind: 'end' | 'x', events: Buffer, progress: string, opening?: Opening): Promise<StepAnswer>;
  release(k: Keys, token: string): Promise<StepAnswer>;
  rewrite(k: Keys, token: string, bounds: LeaseBounds, plan: string, tenant: string, events: Buffer, progress: string, last: '' | 'end' | 'x'): Promise<StepAnswer>;
  followed(k: Keys): Promise<boolean>;
  /** Tells the fleet a stream was handed on, for another frontend to continue it now (nobody will resume it). */
  announce(id: string): Promise<void>;
}

/** What opens a stream in the store: how another frontend would continue it, and whose it is. */
export interface Opening {
  plan: string;
  tenant: string;
}

/**
 * Where a writer's hold on a shared stream stands:
 * - held: its batches are copied (the fence checked at each);
 * - rewrite: a batch was lost (or refused): the next flush rewrites the whole copy from memory;
 * - overflow: the copy outgrew its bound: nothing more is copied (nor can it be taken over);
 * - lost: another frontend took the stream over (this one paused past its lease): it writes nothing more;
 * - finishing: its end was sent while held; its clients get the end once the store has it (a writer
 *   that wakes from a pause to find the stream taken over learns it here, and its end never goes out);
 * - released: handed on (this frontend is going away); finished: ended or stopped, for good.
 */
export type LeaseState = 'held' | 'rewrite' | 'overflow' | 'lost' | 'finishing' | 'released' | 'finished';

/** Why a generation stopped: its frontend no longer holds its stream (another one took it over). */
export class LeaseLost extends Error {
  constructor(id: string) {
    super(`stream ${id} was taken over by another frontend (this one lost its lease): resume it there`);
  }
}

/** The bounds a lease works within (SharedStreams' options). */
export interface LeaseBounds {
  leaseMs: number;
  /** How long a live stream's keys live without a renewal (a crashed frontend's go after this). */
  liveTtlMs: number;
  /** How long an ended stream's copy is kept (the resume window). */
  windowMs: number;
  maxBytes: number;
}

/**
 * A held stream's batches go at least this far apart: one step per batch, not per write, when
 * tokens come faster. A batch goes at once when the stream's last one went longer ago than this and
 * was answered (its first, and every one of an engine whose tokens come slower), so its clients,
 * who get only what the copy holds, wait a Redis round trip, not a timer; else on SharedSteps'
 * timer, or at the answer. A copy to rewrite is tried on that timer too (its backoff bounds it).
 */
export const BATCH_MS = 10;
/** How long after a failed rewrite the next is tried (a store refusing writes is not asked 100 times a second). */
const REWRITE_BACKOFF_MS = 1_000;
/** How many times a stream's end is offered again to a store that did not take it (about as many seconds). */
const FINISH_RETRIES = 30;

/**
 * One frontend's hold on one shared stream: the only writer of its copy in Redis. Every batch,
 * renewal, end and hand-on is one atomic step that checks the fence (the holder token taken with
 * the stream), so a writer that lost its lease writes nothing more; `lost` tells its generation to
 * stop (it releases its worker at once). Batches are numbered, so a lost one is noticed and the
 * whole copy rewritten from the writer's memory: a copy is whole or marked as not.
 */
export class StreamLease {
  private state: LeaseState = 'held';
  private readonly pending: Buffer[] = [];
  /** The stream's keys in the store (made once: every step names them). */
  private readonly keys: Keys;
  /** Bytes of events sent to the copy so far (the store's own count, while no batch was lost). */
  private copied = 0;
  /** Batches sent and not yet answered: while one is, the next waits for its answer (a pipeline, so batches coalesce under load). */
  private inFlight = 0;
  /** When the last batch was sent (performance.now()). */
  private lastSentAt = -Infinity;
  private readonly marks: ProgressMarks;
  private batch: number;
  /** Bumped at each rewrite: answers to steps sent before it are stale. */
  private epoch = 0;
  private nextRewriteAt = 0;
  /** When the last step the store confirmed was sent: the local lease runs from there. */
  private confirmedAt = performance.now();
  private readonly controller = new AbortController();
  /**
   * Until its first step goes, the store has nothing of the stream (nobody else can hold it): that
   * step opens it. A takeover's is in the store already.
   */
  private unopened: boolean;
  private markOpened: () => void = () => undefined;
  /** The stream's whole events, as its writer keeps them (for a rewrite). */
  snapshot: () => Buffer = () => Buffer.alloc(0);
  /** Resolves once the store answered the step that opens the stream (a background response is announced only then). */
  readonly opened: Promise<void>;
  /** Told once the lease is over (finished, released or lost): nothing renews it any more. */
  onOver: () => void = () => undefined;
  /** What the stream's clients may be sent: what the copy holds (this lease's state moves it). */
  readonly gate = new CopyGate();

  constructor(
    readonly id: string,
    private readonly token: string,
    private readonly steps: SharedSteps,
    private readonly bounds: LeaseBounds,
    private readonly plan: string,
    private readonly tenant: string,
    private readonly log: Logger,
    /** A takeover: where the copy stood (its next batch, each sequence, its bytes). */
    from?: { batch: number; resumed: readonly Resumed[]; bytes: number },
  ) {
    this.batch = from?.batch ?? 0;
    this.marks = new ProgressMarks(from?.resumed);
    this.keys = streamKeys(id);
    this.copied = from?.bytes ?? 0;
    this.unopened = from === undefined;
    this.opened = this.unopened ? new Promise((resolve) => (this.markOpened = resolve)) : Promise.resolve();
  }

  /** Aborted (with LeaseLost) once another frontend holds the stream. */
  get lost(): AbortSignal {
    return this.controller.signal;
  }

  get current(): LeaseState {
    return this.state;
  }

  /**
   * Whether the stream can still be written to clients here: not lost, and confirmed within the
   * lease whenever the store could have confirmed it (it answered throughout).
   */
  get valid(): boolean {
    if (this.state === 'lost') return false;
    if (this.state !== 'held' || !this.steps.healthy || this.unopened) return true;
    // Paused past the lease (GC, throttling, SIGSTOP) while the store answered: another frontend may hold the stream now. Fail closed.
    if (this.unconfirmedPastLease() && performance.now() - this.steps.healthySince > this.bounds.leaseMs) {
      this.lose('unconfirmed');
      return false;
    }
    return true;
  }

  /** Bytes for the copy: the gate's mark they go out at, or undefined when they go out now. */
  append(payload: Buffer): number | undefined {
    if (this.state !== 'held' && this.state !== 'rewrite') return undefined;
    this.pending.push(payload);
    // Held bytes wait for their batch; while one is in flight, for its answer.
    if (this.state === 'rewrite') this.steps.schedule(this);
    else if (this.inFlight === 0) this.steps.schedule(this, this.due());
    return this.gate.mark(payload.length);
  }

  /** The stream is no longer kept whole here (past its memory bound): its clients wait for no copy. */
  stopGating(): void {
    this.gate.close('release');
  }

  progress(lane: number, delivered: Delivered): void {
    this.marks.mark(lane, delivered);
  }

  laneDone(lane: number, done: LaneDone): void {
    this.marks.finished(lane, done);
  }

  /** The batch written since the last flush, copied now (SharedSteps calls it when scheduled). */
  flush(): void {
    if (this.state === 'rewrite') return this.rewrite('');
    if (this.state !== 'held' || this.pending.length === 0) return;
    const events = this.takePending();
    const epoch = this.epoch;
    const sentAt = performance.now();
    this.copied += events.length;
    const upTo = this.gate.at;
    this.inFlight++;
    this.lastSentAt = sentAt;
    this.opens((opening) => this.steps.append(this.keys, this.token, this.bounds, this.batch++, events, this.marks.takeDelta(), opening))
      .then(
        (answer) => {
          this.answered(answer, epoch, sentAt, upTo);
          this.sent();
        },
        (err: unknown) => {
          this.failed(err, epoch, sentAt);
          this.sent();
        },
      );
  }

  /** What the step about to go opens the stream with, if it is the first (then the lease runs from it). */
  private opening(): Opening | undefined {
    if (!this.unopened) return undefined;
    this.unopened = false;
    this.confirmedAt = performance.now();
    return { plan: this.plan, tenant: this.tenant };
  }

  /** Runs a step, which opens the stream when it is the first: `opened` resolves once the store answered that one. */
  private opens<T>(step: (opening: Opening | undefined) => Promise<T>): Promise<T> {
    const opening = this.opening();
    const answered = step(opening);
    return opening === undefined ? answered : answered.finally(this.markOpened);
  }

  /** A batch answered: what was written meanwhile goes next (in a copy to rewrite, the rewrite does). */
  private sent(): void {
    this.inFlight--;
    if (this.inFlight === 0 && this.pending.length > 0) this.steps.schedule(this, this.state === 'held' && this.due());
  }

  /** The next batch may go now: the last went at least BATCH_MS ago (or none has). */
  private due(): boolean {
    return performance.now() - this.lastSentAt >= BATCH_MS;
  }

  /** Keeps the lease and the copy alive (SharedSteps' renewal timer). */
  renew(): void {
    if ((this.state !== 'held' && this.state !== 'overflow') || this.unopened) return;
    const epoch = this.epoch;
    const sentAt = performance.now();
    this.steps.renew(this.keys, this.token, this.bounds).then(
      (answer) => this.answered(answer, epoch, sentAt),
      (err: unknown) => this.refused(err, sentAt),
    );
  }

  /**
   * The stream's end, after what is pending: the gate's mark it goes out at (its clients get it once
   * the store holds it, as every batch), or undefined when it goes out now (the copy is not gated).
   */
  end(payload: Buffer): number | undefined {
    if (this.state !== 'held' && this.state !== 'rewrite' && this.state !== 'overflow') return undefined;
    const mark = this.state === 'held' ? this.gate.mark(payload.length) : undefined;
    void this.finish(payload, 'end', mark !== undefined);
    return mark;
  }

  /**
   * The stream's last events (its end, or `kind` x: the error it stopped with), after what is
   * pending; kept for the resume window. Resolves once the store has it (never rejects). The
   * snapshot already holds `payload`. `gated`: its clients wait for the store's answer (see end()).
   */
  async finish(payload: Buffer, kind: 'end' | 'x', gated = false): Promise<void> {
    const from = this.state;
    if (from !== 'held' && from !== 'rewrite' && from !== 'overflow') return;
    // The batch still pending goes with the end, one step instead of two (a short stream's copy is
    // then opened and finished, nothing between), unless together they would pass the copy's bound
    // (a batch of its own says so; the end does not).
    let last = payload;
    if (from === 'held' && this.pending.length > 0) {
      const pendingBytes = this.pending.reduce((n, b) => n + b.length, 0);
      if (this.copied + pendingBytes + payload.length <= this.bounds.maxBytes) last = Buffer.concat([...this.pending, payload]);
      else this.flush();
    }
    this.pending.length = 0;
    const why = kind === 'end' ? 'ended' : 'stopped';
    this.set(gated ? 'finishing' : 'finished', why);
    const sentAt = performance.now();
    try {
      if (from === 'rewrite') {
        if (!(await this.rewriteNow(kind))) await this.finishLater(kind);
        return;
      }
      const epoch = this.epoch;
      const answer = await this.opens((opening) => this.steps.finish(this.keys, this.token, this.bounds, this.batch++, kind, last, this.marks.takeDelta(), opening));
      // Another frontend holds the stream (this one paused past its lease): its end must not go out here.
      if (answer === 'lost') return this.lose('taken');
      if (answer === 'resync' && epoch === this.epoch && !(await this.rewriteNow(kind))) return this.offerEndLater(kind, why);
      if (this.state === 'finishing') this.set('finished', why);
    } catch {
      if (this.state === 'finishing' && this.stoppedPastLease(sentAt)) return this.lose('unconfirmed');
      await this.offerEndLater(kind, why);
    }
  }

  /** The store did not take the end: its clients wait no longer (availability first, as for a failed batch), and it is offered again. */
  private async offerEndLater(kind: 'end' | 'x', why: string): Promise<void> {
    if (this.state === 'finishing') this.set('finished', why);
    if (this.state === 'finished') await this.finishLater(kind);
  }

  /**
   * The store did not take the stream's end (away, failing over): the whole copy, with its end, is
   * written once it answers again (tried each second for a while), so the copy says it ended rather
   * than wait to be taken over and regenerated.
   */
  private async finishLater(kind: 'end' | 'x'): Promise<void> {
    for (let tries = 0; tries < FINISH_RETRIES; tries++) {
      await new Promise((resolve) => setTimeout(resolve, REWRITE_BACKOFF_MS).unref());
      if (!this.steps.healthy) continue;
      if (await this.rewriteNow(kind)) return;
    }
    this.log.warn({ event: 'stream_copy_unfinished', response_id: this.id }, `the stream store did not take stream ${this.id}'s end: its copy there stays unfinished until it expires`);
  }

  /**
   * Lets go of the stream (its frontend is going away): another frontend takes it over at once.
   * Resolves once the store has it (never rejects); false when it could not be handed on.
   */
  async release(announce = false): Promise<boolean> {
    const from = this.state;
    if (from !== 'held' && from !== 'rewrite') return false;
    if (from === 'held') this.flush();
    this.pending.length = 0;
    this.set('released', 'handed on');
    const released = await (async () => {
      if (from === 'rewrite' && !(await this.rewriteNow(''))) return false;
      // Nothing written yet: opened now, so that another frontend starts it afresh.
      if ((await this.opens(async (opening) => (opening === undefined ? 'ok' : this.steps.openEmpty(this.keys, this.token, this.bounds, opening)))) !== 'ok') return false;
      return (await this.steps.release(this.keys, this.token)) === 'ok';
    })().catch(() => false);
    // Handed on: the copy holds every byte (its batch went before the release, in order), so they go
    // out. Not handed on: whoever continues it starts from the copy, so what it lacks never goes out.
    this.gate.close(released ? 'release' : 'drop');
    if (released && announce) await this.steps.announce(this.id).catch(() => undefined);
    return released;
  }

  /** Clients at other frontends follow the stream now (their frontends say so while they do). */
  followedElsewhere(): Promise<boolean> {
    return this.steps.followed(this.keys).catch(() => false);
  }

  private takePending(): Buffer {
    const events = this.pending.length === 1 ? this.pending[0]! : Buffer.concat(this.pending);
    this.pending.length = 0;
    return events;
  }

  private answered(answer: StepAnswer, epoch: number, sentAt: number, upTo?: number): void {
    if (epoch !== this.epoch) return;
    if (answer === 'ok') {
      if (sentAt > this.confirmedAt) this.confirmedAt = sentAt;
      if (upTo !== undefined && this.state === 'held') this.gate.copied(upTo);
      return;
    }
    if (answer === 'lost') return this.lose('taken');
    if (answer === 'resync') {
      if (this.state === 'held') this.set('rewrite', 'a batch did not reach the store');
      return;
    }
    if (answer === 'overflow' && this.state === 'held') this.set('overflow', `the copy passed ${this.bounds.maxBytes} bytes`);
  }

  private failed(err: unknown, epoch: number, sentAt: number): void {
    this.refused(err, sentAt);
    if (epoch !== this.epoch || this.state !== 'held') return;
    if (this.stoppedPastLease(sentAt)) return this.lose('unconfirmed');
    this.set('rewrite', `a batch failed: ${(err as Error).message}`);
  }

  private unconfirmedPastLease(): boolean {
    return performance.now() - this.confirmedAt > this.bounds.leaseMs;
  }

  /**
   * A step that failed having outlived the lease: its command timeout, well within the lease, fired
   * late, so this process stopped meanwhile (SIGSTOP, GC, throttling) with the store's answer unread,
   * and another frontend may hold the stream now: fail closed, as `valid` does. (A store that is
   * merely away fails a step in time: the stream runs on and its copy is rewritten.)
   */
  private stoppedPastLease(sentAt: number): boolean {
    return performance.now() - sentAt > this.bounds.leaseMs && this.unconfirmedPastLease();
  }

  /**
   * A step Redis answered with an error (maxmemory, a read-only replica): the store is there and
   * refuses every write, another frontend's takeover too, so the lease still stands here. Only
   * silence (a pause, a partition) leaves it unconfirmed.
   */
  private refused(err: unknown, sentAt: number): void {
    if ((err as Error | undefined)?.name === 'ReplyError' && sentAt > this.confirmedAt) this.confirmedAt = sentAt;
  }

  private rewrite(last: '' | 'end' | 'x'): void {
    if (performance.now() < this.nextRewriteAt) return;
    void this.rewriteNow(last);
  }

  /** The whole copy again, from this writer's memory; true once the store has it. */
  private async rewriteNow(last: '' | 'end' | 'x'): Promise<boolean> {
    this.epoch++;
    this.pending.length = 0;
    const epoch = this.epoch;
    const sentAt = performance.now();
    this.nextRewriteAt = sentAt + REWRITE_BACKOFF_MS;
    try {
      // A rewrite opens the stream too (it names its plan and tenant).
      const answer = await this.opens(() => this.steps.rewrite(this.keys, this.token, this.bounds, this.plan, this.tenant, this.snapshot(), this.marks.whole(), last));
      if (epoch !== this.epoch) return false;
      if (answer === 'lost') {
        this.lose('taken');
        return false;
      }
      this.batch = 1;
      this.copied = this.snapshot().length;
      if (answer === 'overflow') {
        if (this.state === 'rewrite') this.set('overflow', `the copy passed ${this.bounds.maxBytes} bytes`);
        return false;
      }
      if (sentAt > this.confirmedAt) this.confirmedAt = sentAt;
      if (this.state === 'rewrite') this.set('held', 'the copy was rewritten whole');
      else if (this.state === 'finishing') this.set('finished', 'rewritten whole at its end');
      else if (this.state === 'finished') this.log.info({ event: 'stream_lease', response_id: this.id, to: 'finished', why: 'rewritten whole at its end' }, `stream ${this.id}'s copy was rewritten whole at its end`);
      return true;
    } catch {
      return false;
    }
  }

  private lose(why: 'taken' | 'unconfirmed'): void {
    if (this.state === 'lost' || this.state === 'finished' || this.state === 'released') return;
    this.set('lost', why === 'taken' ? 'another frontend holds it' : `unconfirmed for ${this.bounds.leaseMs} ms (this process paused?)`);
    // Not taken yet (only unconfirmed): handed on, so a follower takes it over now rather than at the lease's end.
    if (why === 'unconfirmed') this.steps.release(this.keys, this.token).catch(() => undefined);
    this.controller.abort(new LeaseLost(this.id));
  }

  /** The one setter: every change logged at debug, the losses and mends at info. */
  private set(next: LeaseState, why: string): void {
    const from = this.state;
    this.state = next;
    if (next === 'held' || next === 'rewrite' || next === 'lost' || next === 'overflow')
      this.log.info({ event: 'stream_lease', response_id: this.id, from, to: next, why }, `stream ${this.id}'s copy: ${from} -> ${next} (${why})`);
    // The gate follows: held bytes wait for their batch; a copy that failed a batch (or outgrew its
    // bound, or ended) waits for nobody; a lease lost drops them (the copy's new writer continues).
    if (next === 'held') this.gate.gate();
    else if (next === 'rewrite') this.gate.open();
    else if (next === 'overflow' || next === 'finished') this.gate.close('release');
    else if (next === 'lost') this.gate.close('drop');
    if (next === 'finished' || next === 'released' || next === 'lost') this.onOver();
  }
}
