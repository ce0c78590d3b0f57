import { EbbError } from '../../protocol/errors.js';

const isIds = (v: unknown): boolean => Array.isArray(v) && v.length > 0 && v.every((id) => Number.isInteger(id) && (id as number) >= 0);

/** The shape of a completions prompt: text, token ids, or a batch of either (never a mix). */
export type PromptShape = 'text' | 'texts' | 'ids' | 'id_batch';

export function promptShape(prompt: unknown): PromptShape {
  if (typeof prompt === 'string') return 'text';
  if (Array.isArray(prompt) && prompt.every((p) => typeof p === 'string')) return 'texts';
  if (isIds(prompt)) return 'ids';
  if (Array.isArray(prompt) && prompt.every(isIds)) return 'id_batch';
  throw new EbbError('invalid_request', 'prompt must be a string, an array of strings, an array of token ids, or an array of such arrays', { param: 'prompt' });
}
