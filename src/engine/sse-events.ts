/**
 * The `data:` payloads of a Server-Sent Events body, one per event (multi-line data joined with
 * newlines, as the SSE spec says). Comments and other fields are skipped: OpenAI-compatible
 * servers only send data events, ending with `data: [DONE]`.
 */
export async function* sseData(body: AsyncIterable<Buffer | string>): AsyncGenerator<string, void, void> {
  const decoder = new TextDecoder();
  let buffer = '';
  let data: string[] = [];
  for await (const chunk of body) {
    buffer += typeof chunk === 'string' ? chunk : decoder.decode(chunk, { stream: true });
    let nl: number;
    while ((nl = buffer.indexOf('\n')) >= 0) {
      const line = buffer.slice(0, nl).replace(/\r$/, '');
      buffer = buffer.slice(nl + 1);
      if (line === '') {
        if (data.length > 0) yield data.join('\n');
        data = [];
      } else if (line.startsWith('data:')) data.push(line.slice(line[5] === ' ' ? 6 : 5));
    }
  }
  if (buffer.startsWith('data:')) data.push(buffer.slice(buffer[5] === ' ' ? 6 : 5).replace(/\r$/, ''));
  if (data.length > 0) yield data.join('\n');
}
