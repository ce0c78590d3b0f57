import { blockHashes, DEFAULT_BLOCK_SIZE, type BlockHash } from '../../protocol/block-hash.js';
import { mockerTokenIds } from '../../protocol/mocker-tokenizer.js';
import { promptOf, type GenerateBody } from '../../protocol/request-plane.js';
import type { WorkerRecord } from '../../discovery/discovery.js';

/**
 * How a worker's cached blocks are named, so the frontend can hash a prompt the same way:
 * `mocker-words` and `worker` are the engine's own token ids (the frontend's hashes match the
 * engine's events); `chars` is the frontend's own, for workers with no declared tokenizer: the
 * prompt's text in fixed character chunks, meaningful only for what this frontend sent (approximate).
 */
export type TokenSpace = 'mocker-words' | 'worker' | 'chars';

/** Characters per block in the `chars` space: about as many as 16 tokens of English. */
export const CHAR_BLOCK = 64;

export interface KvProfile {
  space: TokenSpace;
  blockSize: number;
  /** The worker publishes /kv/events (exact index) or the frontend approximates from what it sent. */
  events: 'exact' | 'none';
  /** Space and block size: workers with equal keys share one set of prompt hashes. */
  key: string;
}

/** Records are immutable once received (a change is a new record): each is read once, not per decision. */
const profiles = new WeakMap<WorkerRecord, KvProfile>();

/** A worker's prefix cache as the router sees it, from its discovery record. */
export function kvProfile(record: WorkerRecord): KvProfile {
  let p = profiles.get(record);
  if (p !== undefined) return p;
  const d = record.kv_cache;
  const space: TokenSpace = d === undefined ? 'chars' : d.tokenizer;
  const blockSize = d === undefined ? CHAR_BLOCK : d.block_size > 0 ? d.block_size : DEFAULT_BLOCK_SIZE;
  p = { space, blockSize, events: d?.events ?? 'none', key: `${space}/${blockSize}` };
  profiles.set(record, p);
  return p;
}

/**
 * The text a request's KV covers on the worker: its prompt, then what earlier workers delivered
 * (a migrated stream's continuation is prefilled after the prompt, a chat's after the answer's turn).
 */
export function routedText(body: GenerateBody): string {
  const prompt = promptOf(body) ?? '';
  const c = body.continuation;
  if (c === undefined || c.text === '') return prompt;
  return body.messages !== undefined ? `${prompt} assistant: ${c.text}` : `${prompt} ${c.text}`;
}

/** The token ids of `body` in a space the frontend computes itself (not `worker`). */
export function localTokens(body: GenerateBody, space: Exclude<TokenSpace, 'worker'>): ArrayLike<number> {
  const text = routedText(body);
  if (space === 'mocker-words') return mockerTokenIds(text);
  const codes = new Uint16Array(text.length);
  for (let i = 0; i < text.length; i++) codes[i] = text.charCodeAt(i);
  return codes;
}

/** A prompt in one token space: its token count and the hashes of its full blocks. */
export interface PromptBlocks {
  tokens: number;
  hashes: BlockHash[];
}

/** `root`: adapterRoot's, for a request naming a LoRA adapter. */
export function promptBlocks(tokens: ArrayLike<number>, blockSize: number, root?: BlockHash): PromptBlocks {
  return { tokens: tokens.length, hashes: blockHashes(tokens, blockSize, root) };
}
