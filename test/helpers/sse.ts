import { sseData } from '../../src/common/sse-events.js';

/** A client for the frontend's SSE streams that records what a user would have seen. */
export interface StreamOutcome {
  status: number;
  tokens: number;
  text: string;
  done: boolean;
  error?: string;
  /** The code of an SSE error event, when the stream ended with one. */
  errorCode?: string;
  workerId: string | null;
  /** Set by the caller's clock: was the first token seen before some event (e.g. a kill)? */
  firstTokenSeen: boolean;
  /** How many `[DONE]` events came: exactly 1 for a stream that completed. */
  doneEvents: number;
  /** The distinct chunk ids seen: one for a stream, however many workers served it. */
  chunkIds: string[];
  /** The usage chunk, when asked for with stream_options.include_usage. */
  usage?: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
}

export async function streamCompletion(
  frontendUrl: string,
  body: Record<string, unknown>,
  onFirstToken: () => void = () => undefined,
  /** Called as each token is read, with what the stream has shown so far (its worker among it). */
  onToken: (tokens: number, seen: StreamOutcome) => void = () => undefined,
  /** Extra request headers (a tenant's, a service tier's). */
  headers: Record<string, string> = {},
): Promise<StreamOutcome> {
  const res = await fetch(`${frontendUrl}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'tell me about tides' }], stream: true, ...body }),
  });
  const out: StreamOutcome = { status: res.status, tokens: 0, text: '', done: false, workerId: res.headers.get('x-ebb-worker-id'), firstTokenSeen: false, doneEvents: 0, chunkIds: [] };
  if (res.status !== 200 || !res.body) {
    out.error = await res.text();
    return out;
  }
  try {
    for await (const data of sseData(res.body as AsyncIterable<Uint8Array>)) {
      if (data === '[DONE]') {
        out.done = true;
        out.doneEvents++;
        continue;
      }
      const parsed = JSON.parse(data);
      if (parsed.error) {
        out.error = parsed.error.message;
        out.errorCode = parsed.error.code;
        continue;
      }
      if (typeof parsed.id === 'string' && !out.chunkIds.includes(parsed.id)) out.chunkIds.push(parsed.id);
      if (parsed.usage) out.usage = parsed.usage;
      const content = parsed.choices?.[0]?.delta?.content;
      if (typeof content === 'string' && content.length > 0) {
        if (out.tokens === 0) {
          out.firstTokenSeen = true;
          onFirstToken();
        }
        out.tokens++;
        out.text += content;
        onToken(out.tokens, out);
      }
    }
  } catch (err) {
    out.error = (err as Error).message;
  }
  return out;
}
