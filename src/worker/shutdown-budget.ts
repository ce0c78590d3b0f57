/**
 * The one budget of a shutdown, measured from the signal: the watchdog fires at its end, and every
 * stage gets what is left of it minus what the stages after it reserve, capped by its own bound.
 * So stages that run late shrink the ones after them instead of pushing the whole past the watchdog.
 */
export class ShutdownBudget {
  readonly endsAt: number;

  constructor(
    readonly startedAt: number,
    readonly totalMs: number,
  ) {
    this.endsAt = startedAt + totalMs;
  }

  /** ms left until the watchdog. */
  get leftMs(): number {
    return this.endsAt - performance.now();
  }

  /** A stage's bound: at most `capMs` (none when undefined), never eating `reserveMs` kept for later stages. */
  stageMs(capMs: number | undefined, reserveMs: number): number {
    return Math.max(0, Math.min(capMs ?? Number.POSITIVE_INFINITY, this.leftMs - reserveMs));
  }
}
