import type { ServerResponse } from 'node:http';
import { EbbError } from '../../protocol/errors.js';
import { ClientStream, type StreamTap } from '../relay/client-stream.js';
import { HeldBytes, type Release } from '../relay/held-bytes.js';
import type { LaneDone } from '../relay/lane.js';
import type { Delivered } from '../relay/migration.js';
import { Shutdown } from '../shutdown.js';
import type { StreamLease } from './stream-lease.js';

/**
 * Where a kept stream is in its life: live while its generation runs; then ended (its end written),
 * stopped (cancelled or failed: an error written), abandoned (its client left and nobody came back
 * within the grace: no longer resumable) or handed on (its frontend went away and another continues
 * it). Resumable while live, and for the window after it ended or stopped.
 */
export type KeptState = 'live' | 'ended' | 'stopped' | 'abandoned' | 'handed_on';

export interface KeptStreamHooks {
  /** The stream's byte bound: past it the stream runs on, no longer kept (resumes are refused). */
  maxBytes: number;
  /** How long a generation runs on with nobody following it (its client left) before it is cancelled. */
  graceMs: number;
  /** A slow follower is cut after this long without reading (as the original client would be). */
  writeTimeoutMs: number;
  /** The store's accounting: bytes kept changed by `delta`. */
  onBytes(delta: number): void;
  /** The stream is over: it stays resumable until the store's window passes. */
  onOver(stream: KeptStream): void;
  /** Events generated while nobody followed, for a stream cancelled at the end of its grace: wasted work. */
  onAbandoned(stream: KeptStream, events: number): void;
}

/** A follower's resume point: events after this id (undefined: from the first). */
export type ResumeFrom = number | undefined;

const ID_PREFIX = Buffer.from('id: ');
const EVENT_END = Buffer.from('\n\n');
const SETTLED: Promise<void> = Promise.resolve();

/** Why a kept stream's generation was stopped when nobody came back to it. */
export class Abandoned extends Error {
  constructor(id: string) {
    super(`stream ${id} was stopped: its client left and nobody resumed it within the grace`);
  }
}

/**
 * One streamed response, kept so that a client can come back to it: every SSE event as it was
 * written (each starts with `id: <n>`), the clients following it, and its generation's own signal,
 * which outlives the original client by a grace (a network blip is not a cancel). Followers get
 * exactly the bytes the original connection got: the kept bytes after their resume point, then
 * the live rest, then the one end. In a fleet its lease copies it to the shared store, the only
 * writer there; a lease lost to another frontend stops the generation here.
 */
export class KeptStream implements StreamTap {
  private chunks: Buffer[] = [];
  private bytes = 0;
  /** Of the kept bytes, how many went to clients (the rest wait for the fleet's copy: see CopyGate). */
  private sentBytes = 0;
  /** Events appended but not yet copied to the shared store (a lease's only): no follower gets them before. */
  private readonly unreleased: HeldBytes | undefined;
  /** Continued from this copy after its writer went away (see regenerates). */
  private takenFrom: { copy: Buffer; error: Buffer } | undefined;
  /** Held events were dropped (its lease was lost): the kept bytes past sentBytes never went out. */
  private dropped = false;
  /**
   * Its end, written while the copy was gated: it goes out (and the stream ends) once the fleet's
   * copy holds it; a lease lost meanwhile drops it, and the stream's owner hands the stream on. The
   * stream stays live until then (followers may still come; see endSettled).
   */
  private heldEnd: { payload: Buffer; mark: number; settled: () => void } | undefined;
  private endSettledP = SETTLED;
  private state: KeptState = 'live';
  /** Past maxBytes: no longer kept, so no longer resumable; its followers still get it live. */
  private overflowed = false;
  endedAt = 0;
  /**
   * Each follower, and the event it waits for when it asked to resume after one not yet made (sent
   * nothing until it passes). Made at the first resume: most streams have none, and an ended stream
   * is kept for the resume window, so what each holds is paid thousands of times over.
   */
  private followers: Map<ClientStream, number | undefined> | undefined;
  /** Its generation's. Let go once the stream is over unstopped (with the listeners it kept): a stopped one keeps its reason. */
  private controller: AbortController | undefined = new AbortController();
  private primary = true;
  private background = false;
  private grace: NodeJS.Timeout | undefined;
  private unfollowed = 0;
  private overP: Promise<void>;
  private settle: (() => void) | undefined;

  constructor(
    readonly id: string,
    private readonly hooks: KeptStreamHooks,
    /** The tenant that made it (its API key's name): nobody else can resume it. */
    readonly tenant: string,
    /** Its copy in the fleet's shared store; none: this frontend's memory alone. */
    readonly lease?: StreamLease | undefined,
  ) {
    this.overP = new Promise((resolve) => (this.settle = resolve));
    if (lease !== undefined) {
      this.unreleased = new HeldBytes();
      lease.snapshot = () => this.whole();
      lease.gate.onRelease((upTo) => this.released(upTo));
      lease.lost.addEventListener('abort', () => this.cancel(lease.lost.reason), { once: true });
    }
  }

  get current(): KeptState {
    return this.state;
  }

  /** Resolves once the generation is over (ended, stopped, handed on). */
  get over(): Promise<void> {
    return this.overP;
  }

  /** The generation's signal: aborted by a cancel, at the end of a grace nobody used, with the request's own cut (shutdown), or when its lease is lost. */
  get signal(): AbortSignal {
    // Over unstopped: a signal never aborted, nobody's to keep (what listens to it is let go with it).
    return this.controller?.signal ?? new AbortController().signal;
  }

  get keptBytes(): number {
    return this.bytes;
  }

  get followerCount(): number {
    return this.followers?.size ?? 0;
  }

  /** Events wait for the fleet's copy (a lease's only). */
  private get holding(): boolean {
    return (this.unreleased?.size ?? 0) > 0;
  }


  /**
   * The original request's signal: a cut (shutdown deadline) ends the generation now; its client
   * leaving is only the start of the grace, unless a resumed client follows.
   */
  watch(requestSignal: AbortSignal): void {
    requestSignal.addEventListener(
      'abort',
      () => {
        // The request's signal aborts for two reasons only: the shutdown's cut, or its client leaving.
        const cut = Shutdown.cutReason(requestSignal);
        if (cut !== undefined) return this.cancel(cut);
        this.primary = false;
        this.maybeOrphaned();
      },
      { once: true },
    );
  }

  /** A background response (or a stream taken over): nobody follows it from the start, and it runs to its end all the same. */
  detach(): void {
    this.primary = false;
    this.background = true;
  }

  /** The events another frontend sent before this one took the stream over: kept, not copied to the store again. */
  seed(payload: Buffer): void {
    this.keep(payload);
    this.sentBytes = this.bytes;
  }

  /**
   * Bytes the original connection is about to be sent (one or more whole events); followers get
   * them too. False when they must not go out: the lease is no longer this frontend's (the stream
   * is stopped here; another frontend has it).
   */
  append(payload: Buffer): boolean | number {
    if (this.state !== 'live' || this.heldEnd !== undefined) return false;
    if (this.lease !== undefined && !this.lease.valid) return false;
    this.keep(payload);
    const mark = this.lease?.append(payload);
    if (!this.primary && this.followerCount === 0) this.unfollowed++;
    if (mark === undefined && !this.holding) {
      this.sendAll(payload);
      return true;
    }
    this.unreleased!.hold(payload, mark ?? 0);
    return mark ?? 0;
  }

  /** The original connection's bytes wait for the copy too (they go out at each release, in order). */
  onRelease(fn: (upTo: Release) => void): void {
    this.lease?.gate.onRelease(fn);
  }

  /** The fleet's copy holds everything up to `upTo` (or what is held never goes out: 'drop'). */
  private released(upTo: Release): void {
    if (upTo === 'drop') this.dropped = true;
    for (const payload of this.unreleased!.take(upTo)) this.sendAll(payload);
    const end = this.heldEnd;
    if (end === undefined || (upTo !== 'drop' && upTo < end.mark)) return;
    this.heldEnd = undefined;
    if (upTo !== 'drop') this.ended(end.payload);
    end.settled();
  }

  /** Resolves once an end written while the copy was gated went out, or was dropped (its lease lost): the stream's owner concludes then. */
  get endSettled(): Promise<void> {
    return this.endSettledP;
  }

  private sendAll(payload: Buffer): void {
    this.sentBytes += payload.length;
    if (this.followers === undefined) return;
    for (const [f, waiting] of this.followers) {
      if (waiting === undefined) this.sendTo(f, payload);
      else {
        const rest = eventsAfter(payload, waiting);
        if (rest === undefined) continue;
        this.followers.set(f, undefined);
        if (rest.length > 0) this.sendTo(f, rest);
      }
    }
  }

  progress(lane: number, delivered: Delivered): void {
    this.lease?.progress(lane, delivered);
  }

  laneDone(lane: number, done: LaneDone): void {
    this.lease?.laneDone(lane, done);
  }

  /**
   * The stream's last bytes, its end event: every follower's response ends with them. False as for
   * append; a number: the end waits for the fleet's copy, and goes out at that mark (see onRelease).
   */
  end(payload: Buffer): boolean | number {
    if (this.state !== 'live' || this.heldEnd !== undefined) return false;
    if (this.lease !== undefined && !this.lease.valid) return false;
    this.keep(payload);
    const mark = this.lease?.end(payload);
    if (mark === undefined) {
      this.ended(payload);
      return true;
    }
    this.endSettledP = new Promise((settled) => (this.heldEnd = { payload, mark, settled }));
    return mark;
  }

  private ended(payload: Buffer): void {
    this.set('ended');
    this.endFollowers(payload);
    this.finish();
  }

  /**
   * The generation stopped without its end (cancelled, abandoned at the end of its grace, failed):
   * `error` (an error event in the stream's format) is its last event, for every follower here and
   * at other frontends: never a silent cut.
   */
  stop(error: Buffer, abandoned = false): void {
    if (this.state !== 'live' || this.heldEnd !== undefined) return;
    this.keep(error);
    this.set(abandoned ? 'abandoned' : 'stopped');
    void this.lease?.finish(error, 'x');
    this.endFollowers(error);
    this.finish();
  }

  /** Stops the generation (an explicit cancel, a shutdown cut, a lost lease); the stream's end is written by whoever ran it. */
  cancel(reason: unknown): void {
    if (this.controller !== undefined && !this.controller.signal.aborted) this.controller.abort(reason);
  }

  /**
   * The frontend is going away with the stream unfinished: it lets go of it in the shared store
   * (no end written, its lease dropped at once), so a peer takes it over on the client's resume.
   * Followers here get `event(last)` (the hand-on error saying where to resume). Resolves with the id
   * of the last event kept (where a client resumes after), or undefined when it could not be handed on.
   */
  async handOn(event: (last: number) => Buffer): Promise<number | undefined> {
    if (this.state !== 'live' || this.lease === undefined || this.overflowed) return undefined;
    // Lost: another frontend runs it already. Else let go of it, so one does.
    // Unattended (a background response): the fleet is told, so another frontend continues it unasked.
    if (this.lease.current !== 'lost' && !(await this.lease.release(this.background))) return undefined;
    // Where clients stand: what went out (a lost lease's held events never did; its new writer makes them).
    const last = lastEventId(this.sent());
    this.set('handed_on');
    this.endFollowers(event(last ?? -1));
    this.finish();
    return last ?? -1;
  }

  /**
   * The stream is continued from `copy` (its writer went away): a follower waiting for an event the
   * copy lacks got it from that writer, ahead of the copy, and no continuation can match what it has.
   * It ends with `error`, as does any later resume to such a point: never a spliced stream.
   */
  regenerates(copy: Buffer, error: Buffer): void {
    this.takenFrom = { copy, error };
    if (this.followers === undefined) return;
    for (const [f, waiting] of this.followers) {
      if (waiting === undefined || eventsAfter(copy, waiting) !== undefined) continue;
      this.followers.delete(f);
      f.end(error);
    }
  }

  /** Whether a resume can be served: the stream is kept whole, not abandoned, and was not handed on. */
  get resumable(): boolean {
    return !this.overflowed && this.state !== 'handed_on' && this.state !== 'abandoned';
  }

  /**
   * A client resuming: the kept events after `from`, then (while live) every event as it comes,
   * then the end. Its response's headers are the stream's; it may leave and come back again. A
   * point past the end of a stream that is over is refused (400): nothing would follow it.
   */
  follow(res: ServerResponse, from: ResumeFrom, headers: Record<string, string>): void {
    const all = this.sent();
    const replay = from === undefined || from < 0 ? all : eventsAfter(all, from);
    if (replay === undefined && this.state !== 'live')
      throw new EbbError('invalid_request', `response ${this.id} has no event ${from}: it ended at event ${lastEventId(all) ?? 'none'}`, { param: 'starting_after' });
    const out = new ClientStream(res, this.hooks.writeTimeoutMs);
    out.begin(200, headers);
    if (this.state !== 'live') return out.end(replay!);
    if (replay === undefined && this.takenFrom !== undefined && eventsAfter(this.takenFrom.copy, from!) === undefined) return out.end(this.takenFrom.error);
    if (replay !== undefined && replay.length > 0) out.write(replay);
    // Its event is not made yet (a client ahead of a background response's start): it waits for it.
    const followers = (this.followers ??= new Map());
    followers.set(out, replay === undefined ? from : undefined);
    clearTimeout(this.grace);
    res.once('close', () => {
      if (followers.delete(out)) this.maybeOrphaned();
    });
  }

  /** The kept bytes clients may have: all but those still waiting for the fleet's copy. */
  private sent(): Buffer {
    const all = this.whole();
    return !this.holding && !this.dropped ? all : all.subarray(0, Math.min(this.sentBytes, all.length));
  }

  /** Every kept byte, in one buffer (kept so: the next resume does not copy again). */
  whole(): Buffer {
    if (this.chunks.length > 1) this.chunks = [Buffer.concat(this.chunks)];
    return this.chunks[0] ?? Buffer.alloc(0);
  }

  /** Frees what the store no longer needs (it forgets the stream). */
  drop(): void {
    this.hooks.onBytes(-this.bytes);
    this.chunks = [];
    this.bytes = 0;
  }

  private keep(payload: Buffer): void {
    if (this.overflowed) return;
    if (this.bytes + payload.length > this.hooks.maxBytes) {
      // Not kept whole any more, so not resumable: its clients wait for no copy.
      this.lease?.stopGating();
      this.overflowed = true;
      this.drop();
      return;
    }
    this.chunks.push(payload);
    this.bytes += payload.length;
    this.hooks.onBytes(payload.length);
  }

  /** A follower that does not keep up holds nothing: past the stream's bound it is cut (it may resume). */
  private sendTo(f: ClientStream, payload: Buffer): void {
    if (f.res.writableLength > this.hooks.maxBytes) return void f.res.destroy();
    f.write(payload);
  }

  /** Every follower's response ends with `payload` (a follower still waiting for its event gets it all the same). */
  private endFollowers(payload: Buffer): void {
    const followers = this.followers;
    if (followers === undefined) return;
    this.followers = undefined;
    for (const [f, waiting] of followers) f.end(waiting === undefined ? payload : (eventsAfter(payload, waiting) ?? payload));
    followers.clear();
  }

  /**
   * Nobody follows a live stream here: it runs on for the grace, then is cancelled (its work
   * metered as wasted), unless clients at other frontends follow it through the shared store.
   */
  private maybeOrphaned(): void {
    if (this.state !== 'live' || this.primary || this.background || this.followerCount > 0) return;
    clearTimeout(this.grace);
    const abandon = async () => {
      if (this.followerCount > 0 || this.state !== 'live') return;
      if (this.lease !== undefined && (await this.lease.followedElsewhere())) return void (this.grace = setTimeout(abandon, Math.max(this.hooks.graceMs, 1_000)).unref());
      if (this.followerCount > 0 || this.state !== 'live') return;
      this.hooks.onAbandoned(this, this.unfollowed);
      this.cancel(new Abandoned(this.id));
    };
    if (this.hooks.graceMs <= 0 && this.lease === undefined) return void abandon();
    this.grace = setTimeout(abandon, this.hooks.graceMs).unref();
  }

  /** The one setter of the stream's state. */
  private set(next: KeptState): void {
    this.state = next;
  }

  private finish(): void {
    clearTimeout(this.grace);
    this.grace = undefined;
    // Kept for the resume window as one buffer, not as the many small ones it was written in (each
    // holding a share of a pooled slab, and an object for the collector to trace, for minutes); and
    // with nothing of its generation's: thousands are held at once.
    this.whole();
    this.endedAt = Date.now();
    this.settle?.();
    this.settle = undefined;
    this.overP = SETTLED;
    if (this.controller?.signal.aborted === false) this.controller = undefined;
    this.hooks.onOver(this);
  }
}

/**
 * The bytes of `events` after the event whose id is `from`, in the order they were sent (choices of
 * one response interleave, so ids need not rise along the stream); undefined when none has that id.
 */
export function eventsAfter(events: Buffer, from: number): Buffer | undefined {
  for (let at = 0; at < events.length; ) {
    const next = events.indexOf(EVENT_END, at);
    if (next < 0) break;
    if (eventId(events, at) === from) return events.subarray(next + EVENT_END.length);
    at = next + EVENT_END.length;
  }
  return undefined;
}

/** The id of the last event of `events` (where a client that has them all resumes after); undefined when none has one. */
export function lastEventId(events: Buffer): number | undefined {
  const at = events.lastIndexOf('\n\nid: ', events.length - EVENT_END.length - 1);
  return eventId(events, at < 0 ? 0 : at + EVENT_END.length);
}

/** The highest event id of `events` (the next one is numbered after it); -1 when none has one. */
export function maxEventId(events: Buffer): number {
  let max = -1;
  for (let at = 0; at < events.length; ) {
    const next = events.indexOf(EVENT_END, at);
    if (next < 0) break;
    max = Math.max(max, eventId(events, at) ?? -1);
    at = next + EVENT_END.length;
  }
  return max;
}

/** The id of the event that starts at `at` (its `id: <n>` line), or undefined when it has none. */
function eventId(events: Buffer, at: number): number | undefined {
  if (events.compare(ID_PREFIX, 0, ID_PREFIX.length, at, at + ID_PREFIX.length) !== 0) return undefined;
  return Number(events.toString('latin1', at + ID_PREFIX.length, events.indexOf(0x0a, at)));
}
