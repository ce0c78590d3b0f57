import { randomUUID } from 'node:crypto';

/** Hex digits of a --processes slot at the start of a response id (up to 4,096 processes). */
const SLOT_DIGITS = 3;

const uuid = () => randomUUID().replaceAll('-', ''); // randomUUID: pooled entropy, ~20x cheaper than randomBytes

/**
 * Response ids, and which process of `--processes N` holds one: an id starts with its process's
 * slot, so a resume, retrieve or next turn that reaches another process is passed to the one that
 * holds it. One process alone: plain random ids, and every id is its own.
 */
export function responseIds(slot: number | undefined) {
  const prefix = slot === undefined ? '' : slot.toString(16).padStart(SLOT_DIGITS, '0');
  return {
    /** A fresh id's random part. */
    newId: (): string => (slot === undefined ? uuid() : prefix + uuid().slice(SLOT_DIGITS)),
    /** The slot of the process that holds `id`, when it is another one. */
    holder: (id: string): number | undefined => {
      if (slot === undefined) return undefined;
      const owner = Number.parseInt(id.replace(/^(chatcmpl-|cmpl-|resp_)/, '').slice(0, SLOT_DIGITS), 16);
      return Number.isInteger(owner) && owner !== slot ? owner : undefined;
    },
  };
}
