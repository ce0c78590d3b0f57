/**
 * When will a draining worker be drained? From what its admitted requests still have to generate
 * and how fast the engine has been generating: each request's tokens still to go (its max_tokens,
 * or the context left where the engine's context bounds it, minus what it generated) times the
 * observed per-token time; requests still waiting for their first token add the observed time to
 * first token, and those beyond the engine's batch slots start only when a slot frees (list
 * scheduling in admission order). Unknown (null) while anything in flight has no bound, or before
 * the engine has produced a token to time.
 */

/** Weight of one new observation in the moving averages: recent enough to follow a load change. */
const EWMA_ALPHA = 0.1;

/** The engine's observed pace: per-token time of a running sequence, and time to first token. */
export class TokenPace {
  private perToken: number | null = null;
  private firstToken: number | null = null;

  /** A gap between two consecutive tokens of one sequence. */
  tokenGap(ms: number): void {
    this.perToken = this.perToken === null ? ms : this.perToken + EWMA_ALPHA * (ms - this.perToken);
  }

  /** Admission to first token, for a request admitted while a batch slot was free (so no queueing in it). */
  firstTokenAfter(ms: number): void {
    this.firstToken = this.firstToken === null ? ms : this.firstToken + EWMA_ALPHA * (ms - this.firstToken);
  }

  get perTokenMs(): number | null {
    return this.perToken;
  }

  get firstTokenMs(): number | null {
    return this.firstToken;
  }
}

/** One admitted request as the estimate sees it. */
export interface InflightProgress {
  /** Tokens this request may generate in all; undefined when nothing bounds it. */
  budget: number | undefined;
  generated: number;
}

/**
 * Milliseconds until every request in `inflight` (admission order) is done, with `slots` sequences
 * running at once; null when unknown.
 */
export function estimateDrainMs(inflight: readonly InflightProgress[], pace: TokenPace, slots: number): number | null {
  if (inflight.length === 0) return 0;
  const perToken = pace.perTokenMs;
  if (perToken === null) return null;
  const firstToken = pace.firstTokenMs ?? perToken;
  // Sequences already generating hold their slots; the rest take slots in admission order.
  const running: number[] = [];
  const waiting: number[] = [];
  for (const r of inflight) {
    if (r.budget === undefined) return null;
    const left = Math.max(0, r.budget - r.generated) * perToken;
    if (r.generated > 0) running.push(left);
    else waiting.push(firstToken + left);
  }
  const free = Math.max(1, slots);
  const finishes = running.slice();
  // Not-started requests fill the free slots at once (they are in their time to first token)...
  let next = 0;
  while (finishes.length < free && next < waiting.length) finishes.push(waiting[next++] as number);
  // ...and the queued ones start each when the earliest running sequence ends.
  finishes.sort((a, b) => a - b);
  while (next < waiting.length) {
    const start = finishes.shift() as number;
    const end = start + (waiting[next++] as number);
    const at = finishes.findIndex((f) => f > end);
    finishes.splice(at < 0 ? finishes.length : at, 0, end);
  }
  return finishes.reduce((m, f) => Math.max(m, f), 0);
}
