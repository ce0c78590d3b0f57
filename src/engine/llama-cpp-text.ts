/**
 * Turns a stream of sampled tokens into the pieces a worker sends: text with the token ids that
 * produced it. Two things are held back until they resolve: a multi-byte character whose bytes
 * arrive as separate byte-fallback tokens, and text that might be the start of a stop string (so a
 * stop string never leaks partly into the answer).
 */

export interface AssembledPiece {
  text: string;
  token_ids: number[];
}

export type Detokenize = (tokens: number[], before: number[]) => string;

/** A detokenized run ending in U+FFFD is an unfinished UTF-8 character, unless it stays so this long. */
const MAX_PENDING_BYTES = 4;
/** Tokens before a run passed to the detokenizer (SentencePiece decides a leading space from them). */
export const CONTEXT_TOKENS = 4;

interface Chunk {
  text: string;
  ids: number[];
}

export class PieceAssembler {
  /** Tokens not yet decoded (an unfinished character). */
  private pending: number[] = [];
  /** Decoded text not yet sent: it may still become a stop string. */
  private held: Chunk[] = [];
  private recent: number[];
  /** Set once a stop string was found: nothing after it is sent. */
  stopped = false;

  constructor(
    private readonly detokenize: Detokenize,
    private readonly stops: readonly string[],
    /** The tokens before the first generated one (prompt and continuation tail). */
    before: number[],
  ) {
    this.recent = before.slice(-CONTEXT_TOKENS);
  }

  /** Adds one sampled token; returns what can be sent now (possibly nothing). */
  push(token: number): AssembledPiece | undefined {
    if (this.stopped) return undefined;
    this.pending.push(token);
    const text = this.detokenize(this.pending, this.recent);
    if (text.endsWith('\uFFFD') && this.pending.length < MAX_PENDING_BYTES) return undefined;
    this.recent = [...this.recent, ...this.pending].slice(-CONTEXT_TOKENS);
    this.held.push({ text, ids: this.pending });
    this.pending = [];
    return this.release();
  }

  /** At the end of generation: whatever is still held goes out (it never became a stop string). */
  flush(): AssembledPiece | undefined {
    if (this.stopped) return undefined;
    if (this.pending.length > 0) {
      this.held.push({ text: this.detokenize(this.pending, this.recent), ids: this.pending });
      this.pending = [];
    }
    return this.take(this.held.length);
  }

  private release(): AssembledPiece | undefined {
    const text = this.held.map((c) => c.text).join('');
    let cut = -1;
    for (const s of this.stops) {
      const i = text.indexOf(s);
      if (i >= 0 && (cut < 0 || i < cut)) cut = i;
    }
    if (cut >= 0) {
      this.stopped = true;
      const ids = [];
      let start = 0;
      for (const c of this.held) {
        if (start < cut) ids.push(...c.ids);
        start += c.text.length;
      }
      this.held = [];
      return cut > 0 ? { text: text.slice(0, cut), token_ids: ids } : undefined;
    }
    // Send whole chunks up to where a stop string could still begin: a chunk's ids go out with
    // all of its text, so a migrated stream resumes exactly after what the client has.
    const safe = text.length - longestStopPrefixSuffix(text, this.stops);
    let n = 0;
    let end = 0;
    while (n < this.held.length && end + (this.held[n] as Chunk).text.length <= safe) end += (this.held[n++] as Chunk).text.length;
    return this.take(n);
  }

  private take(n: number): AssembledPiece | undefined {
    if (n === 0) return undefined;
    const out = this.held.splice(0, n);
    return { text: out.map((c) => c.text).join(''), token_ids: out.flatMap((c) => c.ids) };
  }
}

/** The length of the longest end of `text` that is a proper prefix of some stop string. */
export function longestStopPrefixSuffix(text: string, stops: readonly string[]): number {
  let best = 0;
  for (const s of stops) {
    for (let k = Math.min(s.length - 1, text.length); k > best; k--) {
      if (text.endsWith(s.slice(0, k))) {
        best = k;
        break;
      }
    }
  }
  return best;
}
