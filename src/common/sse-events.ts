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
  let buffer = '';
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
  const eol = /\r\n|\r|\n/g;
  for await (const chunk of body) {
    buffer += typeof chunk === 'string' ? chunk : decoder.decode(chunk, { stream: true });
    let start = 0;
    let m: RegExpExecArray | null;
    for (eol.lastIndex = 0; (m = eol.exec(buffer)) !== null; start = eol.lastIndex) {
      // A CR last in the buffer may be the first half of a CRLF split across chunks: wait for more.
      if (m[0] === '\r' && eol.lastIndex === buffer.length) break;
      yield* line(buffer.slice(start, m.index));
    }
    buffer = buffer.slice(start);
    if (size + buffer.length > maxEventChars) throw tooLong();
  }
  if (buffer !== '') yield* line(buffer.replace(/\r$/, ''));
  yield* line('');
}

/** The `data:` payloads only: OpenAI-compatible servers send data events, ending with `data: [DONE]`. */
export async function* sseData(body: AsyncIterable<Uint8Array | Buffer | string>, maxEventChars = Infinity): AsyncGenerator<string, void, void> {
  for await (const e of sseEvents(body, maxEventChars)) yield e.data;
}
