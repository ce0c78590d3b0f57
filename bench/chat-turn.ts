import { performance } from 'node:perf_hooks';
import { sseData } from '../src/common/sse-events.js';

/** What one streamed chat turn took and got. */
export interface ChatTurn {
  /** To the first content chunk. */
  ttftMs: number;
  answer: string;
  prompt: number;
  /** Prompt tokens the worker found cached (usage.prompt_tokens_details). */
  cached: number;
  tokens: number;
  /** The worker that served it (x-ebb-worker-id). */
  worker: string;
}

/** One streamed chat turn of model m1 through `url` (a frontend): TTFT to the first content, the answer, and the worker's usage. */
export async function chatTurn(url: string, messages: Array<{ role: string; content: string }>, maxTokens: number): Promise<ChatTurn> {
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm1', messages, max_tokens: maxTokens, stream: true, stream_options: { include_usage: true } }),
  });
  if (res.status !== 200 || !res.body) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
  let ttftMs = -1;
  let answer = '';
  let usage: { prompt_tokens: number; completion_tokens: number; prompt_tokens_details?: { cached_tokens?: number } } | undefined;
  for await (const data of sseData(res.body as AsyncIterable<Uint8Array>)) {
    if (data === '[DONE]') break;
    const chunk = JSON.parse(data) as { choices?: Array<{ delta?: { content?: string } }>; usage?: typeof usage; error?: { message: string } };
    if (chunk.error) throw new Error(chunk.error.message);
    const text = chunk.choices?.[0]?.delta?.content;
    if (text) {
      if (ttftMs < 0) ttftMs = performance.now() - t0;
      answer += text;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  if (!usage || ttftMs < 0) throw new Error('a turn ended without tokens or usage');
  return { ttftMs, answer, prompt: usage.prompt_tokens, cached: usage.prompt_tokens_details?.cached_tokens ?? 0, tokens: usage.completion_tokens, worker: res.headers.get('x-ebb-worker-id') ?? '' };
}
