import { request, type Dispatcher } from 'undici';
import { readBounded } from '../common/bounded-read.js';
import { EbbError } from '../protocol/errors.js';
import type { TokenizeRequest } from './engine.js';
import type { EngineKind } from './engine-quiescence.js';

const TOKENIZE_TIMEOUT_MS = 10_000;
const MAX_ANSWER_BYTES = 64 << 20;

/** Kinds whose server documents a tokenize endpoint (vLLM and SGLang: POST /tokenize; llamacpp, llama.cpp's llama-server: POST /tokenize). */
export function canTokenize(kind: EngineKind): boolean {
  return kind === 'vllm' || kind === 'sglang' || kind === 'llamacpp';
}

async function postJson(base: string, path: string, body: unknown, dispatcher: Dispatcher, signal: AbortSignal): Promise<unknown> {
  const all = AbortSignal.any([signal, AbortSignal.timeout(TOKENIZE_TIMEOUT_MS)]);
  const res = await request(`${base}${path}`, {
    method: 'POST',
    dispatcher,
    signal: all,
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const text = await readBounded(res.body, MAX_ANSWER_BYTES, { what: `the answer to POST ${base}${path}` });
  if (res.statusCode === 404 || res.statusCode === 405)
    throw new EbbError('not_found', `the engine server at ${base} has no POST ${path} (answered ${res.statusCode}): this worker cannot tokenize prompts`);
  if (res.statusCode !== 200) throw new Error(`the engine answered ${res.statusCode} to POST ${path}: ${text.slice(0, 300)}`);
  try {
    return JSON.parse(text) as unknown;
  } catch {
    throw new Error(`the engine's answer to POST ${path} is not JSON`);
  }
}

function idsOf(answer: unknown, path: string): number[] {
  const a = answer as { tokens?: unknown; token_ids?: unknown } | null;
  const ids = Array.isArray(a?.tokens) ? a.tokens : Array.isArray(a?.token_ids) ? a.token_ids : undefined;
  if (ids === undefined || !ids.every((t) => Number.isInteger(t))) throw new Error(`the engine's answer to POST ${path} has no token id list (tokens)`);
  return ids as number[];
}

/**
 * The token ids the engine server evaluates for a request, asked of the server itself so they are
 * its tokenizer's and its chat template's. vLLM (and SGLang, same shape): `POST /tokenize` with
 * `{model, prompt}` or `{model, messages, add_generation_prompt}`, answering `{tokens}`.
 * llama-server: `POST /apply-template {messages}` renders a chat to `{prompt}`, and
 * `POST /tokenize {content, add_special, parse_special}` answers `{tokens}`. A continuation's
 * tokens follow the prompt's, as generate sends them.
 */
export async function tokenizeOnEngine(kind: EngineKind, base: string, model: string, req: TokenizeRequest, dispatcher: Dispatcher, signal: AbortSignal): Promise<number[]> {
  const cont = req.continuation;
  if (req.prompt_token_ids !== undefined) return [...req.prompt_token_ids, ...(cont?.token_ids ?? [])];
  if (kind === 'llamacpp') {
    let text = req.prompt;
    if (req.messages !== undefined) {
      const rendered = (await postJson(base, '/apply-template', { messages: req.messages }, dispatcher, signal)) as { prompt?: unknown };
      if (typeof rendered?.prompt !== 'string') throw new Error('the engine\'s answer to POST /apply-template has no prompt');
      text = rendered.prompt;
    }
    if (cont) text += cont.text;
    return idsOf(await postJson(base, '/tokenize', { content: text, add_special: true, parse_special: true }, dispatcher, signal), '/tokenize');
  }
  const body: Record<string, unknown> = { model };
  if (req.messages !== undefined) {
    body.messages = cont ? [...req.messages, { role: 'assistant', content: cont.text }] : req.messages;
    body.add_generation_prompt = cont === undefined;
    if (cont) body.continue_final_message = true;
  } else body.prompt = cont ? req.prompt + cont.text : req.prompt;
  return idsOf(await postJson(base, '/tokenize', body, dispatcher, signal), '/tokenize');
}
