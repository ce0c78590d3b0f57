/** One server-sent event: its name ('message' when it had no `event:` field) and its data. */
export interface SseEvent {
  event: string;
  data: string;
  /** The event's own `id:` field, when it had one (ebb's kept streams number every event). */
  id?: string | undefined;
}

/**
 * The events of a Server-Sent Events body, as they arrive: ebb's one SSE reader (engines' token
 * streams, workers' status streams, the CLI's watch). Lines end in LF, CRLF or CR; multi-line data
 * is joined with newlines and one space after the colon is dropped, as the SSE spec says; comments
 * and events without data are skipped. Unlike the spec, data left without its blank line when the
 * body ends is still an event: some engines end their stream on `data: [DONE]` alone.
 * Fails once one event (or a line not yet ended) is past `maxEventChars`: a peer sending an endless
 * line or event must not grow this process without bound.
 */
export async function* sseEvents(body: AsyncIterable<Uint8Array | Buffer | string> | Iterable<Uint8Array | Buffer | string>, maxEventChars = Infinity): AsyncGenerator<SseEvent, void, void> {
  const decoder = new TextDecoder();
  let event = 'message';
  let data: string[] = [];
  let id: string | undefined;
  let size = 0;
  const tooLong = () => new Error(`event stream event over ${maxEventChars} characters`);
  function* line(l: string): Generator<SseEvent, void, void> {
    if (l === '') {
      if (data.length > 0) yield id === undefined ? { event, data: data.join('\n') } : { event, data: data.join('\n'), id };
      event = 'message';
      data = [];
      id = undefined;
      size = 0;
      return;
    }
    if ((size += l.length) > maxEventChars) throw tooLong();
    const colon = l.indexOf(':');
    if (colon === 0) return; // a comment (heartbeat)
    const field = colon < 0 ? l : l.slice(0, colon);
    const value = colon < 0 ? '' : l.slice(l[colon + 1] === ' ' ? colon + 2 : colon + 1);
    if (field === 'data') data.push(value);
    else if (field === 'event') event = value;
    else if (field === 'id') id = value;
  }
  // The unended line's pieces, joined once it ends: a line as long as a worker's whole-cache
  // snapshot (megabytes, in 64 KiB chunks) is scanned and copied once, not once per chunk.
  let pieces: string[] = [];
  let pending = 0;
  /** The last chunk ended on a CR: its line ended there, and an LF opening the next is its CRLF's. */
  let cr = false;
  const take = (): string => {
    const l = pieces.length === 1 ? pieces[0]! : pieces.join('');
    pieces = [];
    pending = 0;
    return l;
  };
  const eol = /\r\n|\r|\n/g;
  for await (const chunk of body) {
    const text = typeof chunk === 'string' ? chunk : decoder.decode(chunk, { stream: true });
    let start = 0;
    if (cr && text.length > 0) {
      cr = false;
      yield* line(take());
      if (text[0] === '\n') start = 1;
    }
    let m: RegExpExecArray | null;
    for (eol.lastIndex = start; (m = eol.exec(text)) !== null; start = eol.lastIndex) {
      pieces.push(text.slice(start, m.index));
      // A CR last in the chunk may be the first half of a CRLF split across chunks.
      if (m[0] === '\r' && eol.lastIndex === text.length) {
        cr = true;
        start = text.length;
        break;
      }
      yield* line(take());
    }
    if (start < text.length) {
      pieces.push(text.slice(start));
      pending += text.length - start;
    }
    if (size + pending > maxEventChars) throw tooLong();
  }
  if (cr || pieces.length > 0) yield* line(take());
  yield* line('');
}

/** The `data:` payloads only: OpenAI-compatible servers send data events, ending with `data: [DONE]`. */
export async function* sseData(body: AsyncIterable<Uint8Array | Buffer | string>, maxEventChars = Infinity): AsyncGenerator<string, void, void> {
  for await (const e of sseEvents(body, maxEventChars)) yield e.data;
}
