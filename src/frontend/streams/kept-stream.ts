import type { ServerResponse } from 'node:http';
import { ClientStream } from '../relay/client-stream.js';
import { Shutdown } from '../shutdown.js';

/** Where a kept stream is in its life: resumable while live, and for the window after it ended. */
export type KeptState = 'live' | 'ended' | 'abandoned' | 'handed_on';

export interface KeptStreamHooks {
  /** The stream's byte bound: past it the stream runs on, no longer kept (resumes are refused). */
  maxBytes: number;
  /** How long a generation runs on with nobody following it (its client left) before it is cancelled. */
  graceMs: number;
  /** A slow follower is cut after this long without reading (as the original client would be). */
  writeTimeoutMs: number;
  /** The store's accounting: bytes kept changed by `delta`. */
  onBytes(delta: number): void;
  /** The stream is over (ended or abandoned): it stays resumable until the store's window passes. */
  onOver(stream: KeptStream): void;
  /** Events generated while nobody followed, for a stream cancelled at the end of its grace: wasted work. */
  onAbandoned(events: number): void;
  /** A shared store (Redis) the stream's events are copied to, for resumes at other frontends. */
  mirror?: { append(id: string, payload: Buffer): void; ended(id: string, payload: Buffer | undefined): void; release(id: string): void } | undefined;
}

/** A follower's resume point: events after this id (undefined: from the first). */
export type ResumeFrom = number | undefined;

const ID_PREFIX = Buffer.from('id: ');
const EVENT_END = Buffer.from('\n\n');

/**
 * One streamed response, kept so that a client can come back to it: every SSE event as it was
 * written (each starts with `id: <n>`), the clients following it, and its generation's own signal,
 * which outlives the original client by a grace (a network blip is not a cancel). Followers get
 * exactly the bytes the original connection got: the kept bytes after their resume point, then
 * the live rest, then the one end.
 */
export class KeptStream {
  private chunks: Buffer[] = [];
  private bytes = 0;
  state: KeptState = 'live';
  /** Past maxBytes: no longer kept, so no longer resumable; its followers still get it live. */
  overflowed = false;
  endedAt = 0;
  /** Each follower, and the event it waits for when it asked to resume after one not yet made (sent nothing until it passes). */
  private readonly followers = new Map<ClientStream, number | undefined>();
  private readonly controller = new AbortController();
  private primary = true;
  private background = false;
  private grace: NodeJS.Timeout | undefined;
  private unfollowed = 0;
  /** Resolves once the generation is over (ended, failed, abandoned, cancelled). */
  readonly over: Promise<void>;
  private settle!: () => void;

  constructor(
    readonly id: string,
    private readonly hooks: KeptStreamHooks,
  ) {
    this.over = new Promise((resolve) => (this.settle = resolve));
  }

  /** The generation's signal: aborted by a cancel, at the end of a grace nobody used, or with the request's own cut (shutdown). */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  get keptBytes(): number {
    return this.bytes;
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

  /** A background response: nobody follows it from the start, and it runs to its end all the same. */
  detach(): void {
    this.primary = false;
    this.background = true;
  }

  /** The events another frontend sent before this one took the stream over: kept, not copied to the store again. */
  seed(payload: Buffer): void {
    this.keep(payload);
  }

  /** Bytes the original connection was sent (one or more whole events); followers get them too. */
  append(payload: Buffer): void {
    if (this.state !== 'live') return;
    this.keep(payload);
    this.hooks.mirror?.append(this.id, payload);
    if (!this.primary && this.followers.size === 0) this.unfollowed++;
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

  /** The stream's last bytes (its end event, or an error event): every follower's response ends with them. */
  end(payload: Buffer): void {
    if (this.state !== 'live') return;
    this.keep(payload);
    this.hooks.mirror?.ended(this.id, payload);
    this.state = 'ended';
    // A follower still waiting for its event gets how the stream ended all the same (never a silent cut).
    for (const [f, waiting] of this.followers) f.end(waiting === undefined ? payload : (eventsAfter(payload, waiting) ?? payload));
    this.followers.clear();
    this.finish();
  }

  /** Stops the generation (an explicit cancel, a shutdown cut); followers are ended by what the relay writes next. */
  cancel(reason: unknown): void {
    if (!this.controller.signal.aborted) this.controller.abort(reason);
  }

  /** The generation stopped without an end written (its client left and the grace passed, or it was cancelled). */
  stopped(): void {
    if (this.state !== 'live') return;
    this.hooks.mirror?.ended(this.id, undefined);
    this.state = 'abandoned';
    for (const f of this.followers.keys()) f.res.destroy();
    this.followers.clear();
    this.finish();
  }

  /**
   * The frontend is going away with the stream unfinished: it lets go of it in the shared store
   * (no end written, its owner mark dropped at once), so a peer takes it over on the client's
   * resume. Returns the id of the last event kept: where the client resumes after.
   */
  handOn(): number | undefined {
    if (this.state !== 'live' || this.hooks.mirror === undefined) return undefined;
    this.state = 'handed_on';
    this.hooks.mirror.release(this.id);
    for (const f of this.followers.keys()) f.res.destroy();
    this.followers.clear();
    this.finish();
    const all = this.whole();
    const at = all.lastIndexOf('\n\nid: ');
    return eventId(all, at < 0 ? 0 : at + EVENT_END.length);
  }

  /** Whether a resume can be served: the stream is kept whole. */
  get resumable(): boolean {
    return !this.overflowed && this.state !== 'abandoned';
  }

  /**
   * A client resuming: the kept events after `from`, then (while live) every event as it comes,
   * then the end. Its response's headers are the stream's; it may leave and come back again.
   */
  follow(res: ServerResponse, from: ResumeFrom, headers: Record<string, string>): void {
    const out = new ClientStream(res, this.hooks.writeTimeoutMs);
    out.begin(200, headers);
    const all = this.whole();
    const replay = from === undefined || from < 0 ? all : eventsAfter(all, from);
    if (this.state !== 'live') return out.end(replay ?? Buffer.alloc(0));
    if (replay !== undefined && replay.length > 0) out.write(replay);
    // Its event is not made yet (a client ahead of a background response's start): it waits for it.
    this.followers.set(out, replay === undefined ? from : undefined);
    clearTimeout(this.grace);
    res.once('close', () => {
      if (this.followers.delete(out)) this.maybeOrphaned();
    });
  }

  /** Every kept byte, in one buffer (kept so: the next resume does not copy again). */
  private whole(): Buffer {
    if (this.chunks.length > 1) this.chunks = [Buffer.concat(this.chunks)];
    return this.chunks[0] ?? Buffer.alloc(0);
  }

  private keep(payload: Buffer): void {
    if (this.overflowed) return;
    if (this.bytes + payload.length > this.hooks.maxBytes) {
      this.overflowed = true;
      this.hooks.onBytes(-this.bytes);
      this.chunks = [];
      this.bytes = 0;
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

  /** Nobody follows a live stream: it runs on for the grace, then is cancelled (its work metered as wasted). */
  private maybeOrphaned(): void {
    if (this.state !== 'live' || this.primary || this.background || this.followers.size > 0) return;
    clearTimeout(this.grace);
    const abandon = () => {
      this.hooks.onAbandoned(this.unfollowed);
      this.cancel(new Error('client disconnected'));
    };
    if (this.hooks.graceMs <= 0) return abandon();
    this.grace = setTimeout(abandon, this.hooks.graceMs).unref();
  }

  /** Frees what the store no longer needs (it forgets the stream). */
  drop(): void {
    this.hooks.onBytes(-this.bytes);
    this.chunks = [];
    this.bytes = 0;
  }

  private finish(): void {
    clearTimeout(this.grace);
    this.endedAt = Date.now();
    this.settle();
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

/** The id of the event that starts at `at` (its `id: <n>` line), or undefined when it has none. */
function eventId(events: Buffer, at: number): number | undefined {
  if (events.compare(ID_PREFIX, 0, ID_PREFIX.length, at, at + ID_PREFIX.length) !== 0) return undefined;
  return Number(events.toString('latin1', at + ID_PREFIX.length, events.indexOf(0x0a, at)));
}
