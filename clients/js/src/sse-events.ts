/**
 * Server-sent events cut out of a byte stream whole: an event is passed on only once its blank line
 * has arrived, so a connection cut in the middle of one leaves nothing half-read downstream (the
 * resumed stream sends that event again, whole).
 */

/** One whole SSE event: its text as it came (line ends made `\n`) and the fields a resume needs. */
export interface SseEvent {
  /** The event's lines and its closing blank line, ready to hand on. */
  readonly text: string;
  /** The last `id:` field, when it has one. */
  readonly id: string | undefined;
  /** The `event:` field, when it has one. */
  readonly event: string | undefined;
  /** The `data:` lines joined by `\n` (empty when it has none). */
  readonly data: string;
}

/** Frames a stream's bytes into whole events; what is left at its end is a part event, dropped. */
export class SseFramer {
  private readonly decoder = new TextDecoder();
  private pending = '';
  private lines: string[] = [];

  /** The events completed by this chunk of the body. */
  push(chunk: Uint8Array): SseEvent[] {
    this.pending += this.decoder.decode(chunk, { stream: true });
    const events: SseEvent[] = [];
    let start = 0;
    for (let i = 0; i < this.pending.length; i++) {
      const c = this.pending.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      // A CR at the end of what came may be the first half of a CRLF: wait for the next byte.
      if (c === 13 && i === this.pending.length - 1) break;
      const line = this.pending.slice(start, i);
      if (c === 13 && this.pending.charCodeAt(i + 1) === 10) i++;
      start = i + 1;
      if (line !== '') {
        this.lines.push(line);
        continue;
      }
      if (this.lines.length > 0) events.push(eventOf(this.lines));
      this.lines = [];
    }
    this.pending = this.pending.slice(start);
    return events;
  }
}

function eventOf(lines: string[]): SseEvent {
  let id: string | undefined;
  let event: string | undefined;
  const data: string[] = [];
  for (const line of lines) {
    const colon = line.indexOf(':');
    if (colon === 0) continue; // a comment
    const name = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (name === 'id') id = value;
    else if (name === 'event') event = value;
    else if (name === 'data') data.push(value);
  }
  return { text: `${lines.join('\n')}\n\n`, id, event, data: data.join('\n') };
}
