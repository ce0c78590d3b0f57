import type { LaneDone, Resumed } from '../relay/lane.js';
import type { Delivered } from '../relay/migration.js';

/**
 * Where each sequence of a kept stream stood after the events copied so far: what a frontend taking
 * the stream over continues each from. Copied with the events, as deltas: one batch's `p` field is
 * a JSON array of [lane, text delivered since the last batch, tokens since, finish once finished].
 * The text is the model's raw output (before tool-call parsing), what a continuation is built from.
 */
type Delta = [lane: number, text: string, tokens: number, done?: LaneDone];

/** One sequence as the copy has it so far. */
interface LaneMark {
  /** Undefined until the sequence writes here (a takeover's, until its continuation's first events): then `base` is its text. */
  delivered?: Delivered | undefined;
  base: string;
  /** Where the events appended so far have it (byte length, tokens). */
  bytes: number;
  tokens: number;
  /** What was copied (sent with a batch) already. */
  sentBytes: number;
  sentTokens: number;
  done?: LaneDone | undefined;
  doneSent: boolean;
}

/** A stream's per-sequence marks, kept by its writer (StreamLease): deltas for each batch, the whole for a rewrite. */
export class ProgressMarks {
  private readonly lanes = new Map<number, LaneMark>();

  /** A takeover's sequences start where the copy had them. */
  constructor(from?: readonly Resumed[]) {
    from?.forEach((r, lane) => {
      const bytes = Buffer.byteLength(r.text);
      this.lanes.set(lane, { base: r.text, bytes, tokens: r.tokens, sentBytes: bytes, sentTokens: r.tokens, done: r.done, doneSent: r.done !== undefined });
    });
  }

  /** Sequence `lane` now stands at `delivered` (the events for it were just appended). */
  mark(lane: number, delivered: Delivered): void {
    const m = this.lanes.get(lane);
    if (m === undefined) this.lanes.set(lane, { delivered, base: '', bytes: delivered.byteLength, tokens: delivered.tokens, sentBytes: 0, sentTokens: 0, doneSent: false });
    else {
      m.delivered = delivered;
      m.bytes = delivered.byteLength;
      m.tokens = delivered.tokens;
    }
  }

  finished(lane: number, done: LaneDone): void {
    const m = this.lanes.get(lane);
    if (m !== undefined) m.done = done;
  }

  /** What changed since the last call, as a batch's `p` ('' when nothing did). */
  takeDelta(): string {
    const out: Delta[] = [];
    for (const [lane, m] of this.lanes) {
      const text = m.bytes > m.sentBytes ? m.delivered!.textBetween(m.sentBytes, m.bytes) : '';
      const tokens = m.tokens - m.sentTokens;
      const done = m.done !== undefined && !m.doneSent ? m.done : undefined;
      if (text === '' && tokens === 0 && done === undefined) continue;
      out.push(done === undefined ? [lane, text, tokens] : [lane, text, tokens, done]);
      m.sentBytes = m.bytes;
      m.sentTokens = m.tokens;
      if (done !== undefined) m.doneSent = true;
    }
    return out.length === 0 ? '' : JSON.stringify(out);
  }

  /** Everything from the start, for a rewrite of the whole copy (and what was sent is all of it now). */
  whole(): string {
    const out: Delta[] = [];
    for (const [lane, m] of this.lanes) {
      const text = m.delivered === undefined ? m.base : m.delivered.textBetween(0, m.bytes);
      out.push(m.done === undefined ? [lane, text, m.tokens] : [lane, text, m.tokens, m.done]);
      m.sentBytes = m.bytes;
      m.sentTokens = m.tokens;
      m.doneSent = m.done !== undefined;
    }
    return JSON.stringify(out);
  }
}

/** The sequences of a copy: each batch's deltas summed, in order; `lanes` many (those never marked: nothing yet). */
export function progressOf(deltas: ReadonlyArray<string | undefined>, lanes: number, rewriteAt = -1): Resumed[] {
  const out: Resumed[] = Array.from({ length: lanes }, () => ({ text: '', tokens: 0 }));
  deltas.forEach((p, i) => {
    if (i === rewriteAt) for (const r of out) Object.assign(r, { text: '', tokens: 0, done: undefined });
    if (p === undefined || p === '') return;
    for (const [lane, text, tokens, done] of JSON.parse(p) as Delta[]) {
      const r = out[lane];
      if (r === undefined) continue;
      r.text += text;
      r.tokens += tokens;
      if (done !== undefined) r.done = done;
    }
  });
  return out;
}
