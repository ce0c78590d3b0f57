import { request, type Agent } from 'undici';
import { readBounded } from '../../common/bounded-read.js';
import type { GenerateBody } from '../../protocol/request-plane.js';
import type { WorkerRecord } from '../../discovery/discovery.js';
import type { Tokenize } from './router.js';

/** Tokenizing is on the request's path: a worker slower than this is routed around (by load alone). */
export const TOKENIZE_TIMEOUT_MS = 500;
/** Counting a request's tokens (POST /v1/responses/input_tokens) is the answer itself: a worker gets longer. */
export const COUNT_TIMEOUT_MS = 10_000;
/** A prompt of a million tokens is about 8 MB of JSON ids. */
const TOKENIZE_ANSWER_LIMIT = 16 * 1024 * 1024;

/** A worker's answer to POST /tokenize: the ids, or the status it refused with (404: its engine cannot tokenize). */
export type TokenAnswer = { ids: number[] } | { refused: number };

/**
 * POST {request_url}/tokenize on a worker whose engine's tokenizer the frontend cannot run itself
 * (kv_cache.tokenizer `worker`): the body carries the request's prompt as /generate would, the
 * answer is {token_ids}. A continuation's text is appended, as the engine prefills it after the prompt.
 * Undefined: the body has no prompt to tokenize.
 */
export function workerTokens(agent: Agent, headers: Record<string, string>, timeoutMs: number): (worker: WorkerRecord, body: GenerateBody) => Promise<TokenAnswer | undefined> {
  return async (worker, body) => {
    const ask: Partial<GenerateBody> = { model: body.model };
    if (body.prompt !== undefined) ask.prompt = body.continuation ? `${body.prompt}${body.continuation.text}` : body.prompt;
    else if (body.messages !== undefined) ask.messages = body.continuation ? [...body.messages, { role: 'assistant', content: body.continuation.text }] : body.messages;
    else if (body.prompt_token_ids !== undefined) ask.prompt_token_ids = body.prompt_token_ids;
    else return undefined;
    const res = await request(`${worker.request_url.replace(/\/+$/, '')}/tokenize`, {
      method: 'POST',
      headers: { ...headers, 'content-type': 'application/json' },
      body: JSON.stringify(ask),
      dispatcher: agent,
      signal: AbortSignal.timeout(timeoutMs),
    });
    if (res.statusCode !== 200) {
      await res.body.dump();
      return { refused: res.statusCode };
    }
    const ids = (JSON.parse(await readBounded(res.body, TOKENIZE_ANSWER_LIMIT)) as { token_ids?: unknown }).token_ids;
    if (!Array.isArray(ids) || !ids.every((t) => Number.isSafeInteger(t))) return { refused: 502 };
    if (body.prompt_token_ids !== undefined && body.continuation?.token_ids !== undefined) return { ids: [...(ids as number[]), ...body.continuation.token_ids] };
    return { ids: ids as number[] };
  };
}

/** The kv router's tokenizer: a worker's ids within TOKENIZE_TIMEOUT_MS, else undefined (routed by load alone). */
export function workerTokenizer(agent: Agent, headers: Record<string, string>): Tokenize {
  const ask = workerTokens(agent, headers, TOKENIZE_TIMEOUT_MS);
  return async (worker, body) => {
    const answer = await ask(worker, body);
    return answer !== undefined && 'ids' in answer ? answer.ids : undefined;
  };
}
