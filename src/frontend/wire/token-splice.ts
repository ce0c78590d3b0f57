/**
 * The relay's fast path: a worker's text line is `{"text":"..."}` and an SSE token event carries the
 * same JSON string, so the frontend copies the string's bytes into a pre-built frame instead of
 * parsing the line and serialising the text again. Only strings that need no unescaping take it;
 * anything else (escapes, token ids, control bytes) is parsed as before.
 */

/** `{"text":"` */
const PREFIX = [0x7b, 0x22, 0x74, 0x65, 0x78, 0x74, 0x22, 0x3a, 0x22];
const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const CLOSE = 0x7d;

/**
 * Where the text of the line buf[start, end) starts when the line is exactly `{"text":"<plain>"}`
 * and <plain> has no quote, backslash or control byte: its bytes then are the text's UTF-8, and run
 * to end - 2. -1 for any other line.
 */
export function plainTextStart(buf: Buffer, start: number, end: number): number {
  const from = start + PREFIX.length;
  if (end - from < 2 || buf[end - 1] !== CLOSE || buf[end - 2] !== QUOTE) return -1;
  for (let i = 0; i < PREFIX.length; i++) if (buf[start + i] !== PREFIX[i]) return -1;
  for (let i = from, last = end - 2; i < last; i++) {
    const c = buf[i]!;
    if (c < 0x20 || c === QUOTE || c === BACKSLASH) return -1;
  }
  return from;
}

/** A token event as bytes around the token's JSON string content (the part between its quotes). */
export interface SpliceFrame {
  head: Buffer;
  tail: Buffer;
}

/** Below this many bytes a loop copies faster than Buffer#copy, which makes a view of its source first. */
const SHORT_COPY = 64;

/** src[start, end) into dst at `at`; returns the position after it. Tokens are a few bytes: no view per copy. */
export function copyBytes(src: Buffer, start: number, end: number, dst: Buffer, at: number): number {
  if (end - start < SHORT_COPY) {
    for (let i = start; i < end; i++) dst[at++] = src[i]!;
    return at;
  }
  return at + src.copy(dst, at, start, end);
}
