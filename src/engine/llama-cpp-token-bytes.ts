import type { LlamaModel, Token } from 'node-llama-cpp';

/**
 * A token's own bytes, for logprobs' `bytes`: a token that is part of a UTF-8 character has no
 * text of its own (node-llama-cpp hands it out as U+FFFD), so its bytes come from the vocabulary.
 * Undefined: the UTF-8 of the token's text is its bytes.
 */
export type TokenBytes = (token: Token) => number[] | undefined;

/** The GGUF's tokenizer entries (tokenizer.ggml.*), where the file has them. */
export function ggmlTokenizer(model: LlamaModel): { model?: unknown; tokens?: readonly string[] } | undefined {
  const meta = model.fileInfo.metadata as unknown as Record<string, Record<string, unknown> | undefined>;
  return meta.tokenizer?.ggml as { model?: unknown; tokens?: readonly string[] } | undefined;
}

/** SentencePiece spells a byte-fallback token `<0xE2>`. */
const BYTE_TOKEN = /^<0x([0-9A-Fa-f]{2})>$/;

/**
 * GPT-2's byte-level BPE spells every byte as a printable character: the printable Latin-1 bytes
 * as themselves, the others as U+0100 onwards in byte order. The inverse, character to byte.
 */
function byteLevelAlphabet(): Map<string, number> {
  const printable = (b: number) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  const alphabet = new Map<string, number>();
  let shifted = 0x100;
  for (let b = 0; b < 256; b++) alphabet.set(String.fromCodePoint(printable(b) ? b : shifted++), b);
  return alphabet;
}

/** The bytes a byte-level BPE token's spelling stands for; undefined for a spelling outside its alphabet (a special token). */
export function byteLevelBytes(spelling: string, alphabet: ReadonlyMap<string, number> = BYTE_LEVEL): number[] | undefined {
  const out: number[] = [];
  for (const c of spelling) {
    const b = alphabet.get(c);
    if (b === undefined) return undefined;
    out.push(b);
  }
  return out;
}

const BYTE_LEVEL = byteLevelAlphabet();

/** How this model's tokens map to bytes: SentencePiece's byte tokens and byte-level BPE's tokens; other vocabularies by their text. */
export function tokenBytesOf(model: LlamaModel): TokenBytes {
  const tokenizer = ggmlTokenizer(model);
  const tokens = tokenizer?.tokens;
  if (tokens === undefined) return () => undefined;
  if (tokenizer?.model === 'llama')
    return (t) => {
      const hex = BYTE_TOKEN.exec(tokens[t] ?? '')?.[1];
      return hex !== undefined && model.getTokenAttributes(t).byte ? [parseInt(hex, 16)] : undefined;
    };
  if (tokenizer?.model === 'gpt2') return (t) => (model.getTokenAttributes(t).normal ? byteLevelBytes(tokens[t] ?? '') : undefined);
  return () => undefined;
}
