import type { ClientStream } from './client-stream.js';
import type { TokenLogprob } from '../../protocol/request-plane.js';

import type { Delivered } from './migration.js';
import type { EventIds, StreamFormat } from '../wire/stream-format.js';
import { copyBytes, type SpliceFrame } from '../wire/token-splice.js';
import type { LaneSink } from './lane.js';
import type { UpstreamStream } from './upstream.js';

/** `id: ` and the newline around an event id's digits. */
const ID_LINE = 5;
const decimalDigits = (n: number) => (n < 10 ? 1 : n < 100 ? 2 : n < 1000 ? 3 : n < 10_000 ? 4 : n < 100_000 ? 5 : String(n).length);
const ID_HEAD = Buffer.from('id: ');

/** `id: <n>\n` into buf at pos, digit by digit (no string per event); returns the position after it. */
function writeIdLine(buf: Buffer, pos: number, n: number): number {
  buf.set(ID_HEAD, pos);
  const end = pos + ID_HEAD.length + decimalDigits(n);
  for (let at = end - 1, rest = n; at >= pos + ID_HEAD.length; at--, rest = Math.floor(rest / 10)) buf[at] = 0x30 + (rest % 10);
  buf[end] = 0x0a;
  return end + 1;
}

/** A settled promise: a microtask through it costs less than queueMicrotask's async-scope wrapper. */
const RESOLVED = Promise.resolve();

/**
 * One lane's tokens on their way to the client: recorded as delivered (for a continuation
 * elsewhere) and turned into SSE events as the worker's bytes are parsed, then written as one
 * Buffer per network read (the flush runs once the read is parsed, as a microtask). With a format
 * that has a splice frame, a token's bytes are copied between the frame's head and tail and never
 * decoded; otherwise the format builds each event from the text. A client that does not keep up
 * holds the worker's reads until its socket drains.
 */
export class LaneWriter implements LaneSink {
  /** The upstream body feeding this lane now (it changes when the lane moves to another worker). */
  private body: UpstreamStream['body'] | undefined;
  private readonly frame: SpliceFrame | undefined;
  /** Splice: each token's JSON string content, as segBufs[k][segStarts[k], segEnds[k]) (no view per token). */
  private readonly segBufs: Buffer[] = [];
  private readonly segStarts: number[] = [];
  private readonly segEnds: number[] = [];
  private segmentBytes = 0;
  /** Resumable streams: each spliced event's id, taken as it arrives (so ids follow the order events are made). */
  private readonly ids: EventIds | undefined;
  private readonly segIds: number[] = [];
  private idBytes = 0;
  /** No splice frame: the events, built. */
  private text = '';
  private scheduled = false;
  /** The worker's final line came: what is pending waits for an explicit flush (the relay writes it with the end). */
  private lingering = false;
  private readonly flushNow = () => {
    if (!this.lingering) this.flush();
  };
  private readonly resume = () => this.body?.resumeReads();

  constructor(
    private readonly out: ClientStream,
    private readonly lane: number,
    private readonly fmt: StreamFormat,
    private readonly delivered: Delivered,
  ) {
    this.frame = fmt.splice?.(lane);
    this.ids = fmt.ids;
  }

  follow(body: UpstreamStream['body']): void {
    this.body = body;
  }

  plain(buf: Buffer, start: number, end: number): void {
    this.delivered.addBytes(buf, start, end);
    if (this.frame) this.segment(buf, start, end);
    else this.event(this.fmt.token(this.lane, buf.toString('utf8', start, end)));
  }

  piece(text: string, tokenIds: number[] | undefined, logprobs?: TokenLogprob[]): void {
    this.delivered.add(text, tokenIds);
    if (this.frame) {
      const literal = Buffer.from(JSON.stringify(text).slice(1, -1));
      this.segment(literal, 0, literal.length);
    } else this.event(this.fmt.token(this.lane, text, logprobs));
  }

  final(): void {
    this.lingering = true;
  }

  /** Writes what is pending (idempotent); called at each read's end and before anything else is written for the lane. */
  flush(): void {
    this.scheduled = false;
    this.lingering = false;
    let ok = true;
    const frame = this.frame;
    const count = this.segBufs.length;
    if (frame && count > 0) {
      const { segBufs, segStarts, segEnds } = this;
      const { buf, at } = this.out.alloc(this.segmentBytes + this.idBytes + count * (frame.head.length + frame.tail.length));
      let pos = at;
      const ids = this.ids === undefined ? undefined : this.segIds;
      for (let k = 0; k < count; k++) {
        if (ids !== undefined) pos = writeIdLine(buf, pos, ids[k]!);
        buf.set(frame.head, pos);
        pos = copyBytes(segBufs[k]!, segStarts[k]!, segEnds[k]!, buf, pos + frame.head.length);
        buf.set(frame.tail, pos);
        pos += frame.tail.length;
      }
      segBufs.length = 0;
      segStarts.length = 0;
      segEnds.length = 0;
      this.segmentBytes = 0;
      this.segIds.length = 0;
      this.idBytes = 0;
      ok = this.out.send(buf);
      this.out.tap?.progress?.(this.lane, this.delivered);
    } else if (this.text !== '') {
      ok = this.out.write(this.text);
      this.text = '';
      this.out.tap?.progress?.(this.lane, this.delivered);
    }
    if (!ok && this.body) {
      this.body.holdReads();
      this.out.whenDrained(this.resume);
    }
  }

  private segment(buf: Buffer, start: number, end: number): void {
    if (this.ids !== undefined) {
      const id = this.ids.take();
      this.segIds.push(id);
      this.idBytes += ID_LINE + decimalDigits(id);
    }
    this.segBufs.push(buf);
    this.segStarts.push(start);
    this.segEnds.push(end);
    this.segmentBytes += end - start;
    this.schedule();
  }

  private event(text: string): void {
    this.text += text;
    this.schedule();
  }

  private schedule(): void {
    if (this.scheduled) return;
    this.scheduled = true;
    void RESOLVED.then(this.flushNow);
  }
}
