/**
 * The mocker's tokenizer: one token per whitespace-separated word (as countTokens counts them), its
 * id a hash of the word. It lives in protocol/ because the frontend tokenizes prompts for models
 * served by mockers (kv-cache routing) exactly as the mocker does.
 */
export const MOCKER_VOCAB_SIZE = 1 << 20;

export function mockerTokenIds(text: string): number[] {
  const out: number[] = [];
  let h = 0;
  let inWord = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    // The same separators as /\s+/ for the text the API accepts (ASCII and the common Unicode spaces).
    const space = c === 32 || (c >= 9 && c <= 13) || c === 160 || c === 0x2028 || c === 0x2029 || c === 0xfeff || (c >= 0x2000 && c <= 0x200a) || c === 0x1680 || c === 0x202f || c === 0x205f || c === 0x3000;
    if (space) {
      if (inWord) out.push(h % MOCKER_VOCAB_SIZE);
      inWord = false;
      continue;
    }
    if (!inWord) h = 0x811c9dc5;
    inWord = true;
    h = Math.imul(h ^ c, 0x01000193) >>> 0;
  }
  if (inWord) out.push(h % MOCKER_VOCAB_SIZE);
  return out;
}
