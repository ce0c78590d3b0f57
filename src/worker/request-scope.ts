import type { RoutedHold } from './routed-load.js';
import type { ServerResponse } from 'node:http';
import { PausedForContinuation, type GeneratedPiece, type GenerateResult } from '../engine/engine.js';
import type { ReleaseOutcome, Ticket } from '../lifecycle/admission.js';
import type { Handoff, KvTransferRef, RequestTier } from '../protocol/request-plane.js';
import type { AdapterHold } from './adapters.js';
import type { WorkerTrace } from '../tracing/worker-trace.js';

/** Why a scope was aborted: the caller left, or the worker's shutdown deadline cut it. */
export class ShutdownCut extends Error {
  constructor() {
    super('the worker shut down before this request finished (drain deadline reached)');
  }
}

/** Why a scope was aborted at a drain deadline: the caller continues the request elsewhere. */
export class HandOff extends PausedForContinuation {
  constructor(message = 'the worker handed this request off at its drain deadline', reason: Handoff['reason'] = 'drain_deadline') {
    super(message, reason);
  }
}

/** Why a flex scope was aborted for a priority request: handed off as at a drain deadline, its caller continues it later. */
export class Preempted extends HandOff {
  constructor(readonly by: string) {
    super(`a priority request (${by}) took this flex request's batch slot`, 'preempted');
  }
}

/**
 * The one owner of an admitted request on the worker: its admission slot (ticket), its abort
 * signal and its engine generator. `close` releases all three, once, whichever way the request
 * ends: finished, failed, the client left (its response closed early), or cut by shutdown.
 * Nothing else releases a ticket or returns a generator.
 */
export class RequestScope {
  private readonly abort = new AbortController();
  private tokens: AsyncGenerator<GeneratedPiece, GenerateResult, void> | undefined;
  private closed = false;

  constructor(
    readonly ticket: Ticket,
    readonly res: ServerResponse,
    private readonly onClose: (scope: RequestScope) => void,
  ) {
    res.once('close', () => {
      if (res.writableFinished) return;
      this.abort.abort(new Error('client disconnected'));
      this.close('dropped');
    });
  }

  get id(): string {
    return this.ticket.id;
  }

  get signal(): AbortSignal {
    return this.abort.signal;
  }

  /** Tokens generated so far: what a hand-off line reports, and the drain ETA counts down from. */
  generated = 0;
  /** Tokens this request may generate in all (max_tokens, or the context left); undefined when unbounded. */
  budget: number | undefined;
  /** Handed off: where the next worker may pull this sequence's KV state (engines that export it). */
  handoffKv: KvTransferRef | undefined;
  /** The LoRA adapter it runs under: counted in that adapter's in-flight until the scope closes. */
  adapter: AdapterHold | undefined;
  /** Admitted while a batch slot was free: its time to first token has no queueing in it. */
  admittedToFreeSlot = false;
  /** Its tier (the request plane's service_tier), and whether its caller lets a priority request pause it (flex only). */
  tier: RequestTier = 'default';
  preemptible = false;
  /** Its routing frontend's count of it here (told to the frontends on the KV event stream). */
  routed: RoutedHold | undefined;
  /** With tracing on: the worker's span of this request. */
  trace: WorkerTrace | undefined;
  private readonly startedAt = performance.now();
  private lastPieceAt: number | undefined;
  /** The longest pause between two pieces so far (ms): a stall, for its trace. */
  maxGapMs = 0;

  /**
   * Counts `n` generated tokens and times them for the drain ETA: the gap since the previous piece,
   * or for the first one the time since admission.
   */
  piece(n: number, pace: { tokenGap(ms: number): void; firstTokenAfter(ms: number): void }): void {
    const now = performance.now();
    if (this.lastPieceAt !== undefined) {
      const gap = now - this.lastPieceAt;
      if (gap > this.maxGapMs) this.maxGapMs = gap;
      pace.tokenGap(gap / Math.max(1, n));
    } else {
      if (this.admittedToFreeSlot) pace.firstTokenAfter(now - this.startedAt);
      this.routed?.prefilled();
      this.onFirstPiece?.(this);
    }
    this.lastPieceAt = now;
    this.generated += n;
  }

  /** True when the client went away: there is nobody left to answer. */
  get dropped(): boolean {
    const reason: unknown = this.abort.signal.reason;
    return this.abort.signal.aborted && !(reason instanceof ShutdownCut) && !(reason instanceof HandOff);
  }

  /** The engine's generator for this request, closed with the scope. */
  attach(tokens: AsyncGenerator<GeneratedPiece, GenerateResult, void>): AsyncGenerator<GeneratedPiece, GenerateResult, void> {
    this.tokens = tokens;
    if (this.closed) void this.returnTokens();
    return tokens;
  }

  /** Shutdown deadline: stop generating; the serving code ends the response with a terminal error line. */
  cut(): void {
    if (!this.abort.signal.aborted) this.abort.abort(new ShutdownCut());
  }

  /** Drain deadline: stop generating; the serving code ends the response with a terminal hand-off line. */
  handOff(): void {
    if (!this.abort.signal.aborted) this.abort.abort(new HandOff());
  }

  /** A priority request takes its batch slot: stop generating; the response ends with a `preempted` hand-off line. */
  preempt(by: string): void {
    if (!this.abort.signal.aborted) this.abort.abort(new Preempted(by));
  }

  /** Ends the response with `chunk`, then closes the scope as `outcome` once it is flushed. */
  end(chunk: string, outcome: ReleaseOutcome): void {
    if (this.res.writableEnded) return this.close(outcome);
    this.res.end(chunk, () => this.close(outcome));
  }

  close(outcome: ReleaseOutcome): void {
    if (this.closed) return;
    this.closed = true;
    this.trace?.outcome(outcome);
    if (!this.abort.signal.aborted) this.abort.abort(new Error(`request ${outcome}`));
    // A generator left suspended at a yield would keep its batch slot.
    void this.returnTokens().then(() => this.freed());
    this.ticket.release(outcome);
    this.adapter?.release();
    this.routed?.release();
    this.onClose(this);
  }

  /** Resolves once its adapter applies (at once without one); rejects if that load fails or the scope aborts. */
  adapterReady(): Promise<void> {
    const hold = this.adapter;
    if (hold === undefined) return Promise.resolve();
    const signal = this.abort.signal;
    // Aborted before it was asked (the client left during a KV pull): an 'abort' listener would never fire.
    if (signal.aborted) return Promise.reject(signal.reason);
    return new Promise<void>((resolve, reject) => {
      const onAbort = () => reject(signal.reason);
      signal.addEventListener('abort', onAbort, { once: true });
      hold.ready.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
    });
  }

  /** Its engine generator has ended (its batch slot is back): set by settle and close. */
  slotFreed = false;
  /** Told once its slot is back (the preemption that paused it counts the slots being freed). */
  onSlotFreed: (() => void) | undefined;
  /** Told at its first piece: it holds a slot and, flex, could now be paused (the worker's Preemption). */
  onFirstPiece: ((scope: RequestScope) => void) | undefined;

  /** Ends the engine's generator and waits for it (its cleanup, e.g. a hand-off's KV export, included). */
  async settle(): Promise<void> {
    await this.returnTokens();
    this.freed();
  }

  private freed(): void {
    if (this.slotFreed) return;
    this.slotFreed = true;
    this.onSlotFreed?.();
  }

  private async returnTokens(): Promise<void> {
    await this.tokens?.return(undefined as never).catch(() => undefined);
  }
}
