/**
 * The llama-cpp context's one sequence more than its batch slots (--preemption-spare-sequence).
 *
 * A paused flex stream's sequence is busy after its pause: its decode in flight ends, then its KV
 * state is written to a file. Without a spare its batch slot goes back only after that, and the
 * priority request it was paused for waits for it. With one more sequence than slots, the paused
 * stream lends itself the spare: its slot goes back at once, the priority request takes the free
 * sequence (a request holding a slot always finds one), and the paused sequence, once its state is
 * written and it is given back, is the free one. Which sequence is free is the prefix cache's
 * business (llama-cpp-prefix-reuse.ts); this holds only whether the spare is lent: sequences taken
 * = slots held + 1 when lent, so at most one stream is lent it. A second pause while it is lent
 * keeps its slot until its sequence is back, as without a spare.
 */
type SpareState = { kind: 'off' } | { kind: 'free' } | { kind: 'lent'; to: string };

export class SpareSequence {
  private state: SpareState;
  /** Pauses that gave their slot back before their sequence (GET /engine/status). */
  private lentTotal = 0;

  constructor(on: boolean) {
    this.state = on ? { kind: 'free' } : { kind: 'off' };
  }

  private set(next: SpareState): void {
    if (next.kind === 'lent') this.lentTotal++;
    this.state = next;
  }

  /** The context's sequences beyond the batch slots, with the option on or off (the context is made before the engine). */
  static sequencesFor(on: boolean): number {
    return on ? 1 : 0;
  }

  /** The context's sequences beyond the batch slots. */
  get sequences(): number {
    return SpareSequence.sequencesFor(this.state.kind !== 'off');
  }

  /** Lent to a paused stream still ending its decode and writing its state. */
  get lent(): boolean {
    return this.state.kind === 'lent';
  }

  /**
   * Lends the spare to a paused stream whose slot goes back before its sequence: the returned
   * function ends the lend (call it once its sequence is given back). Undefined when off or lent.
   */
  lend(to: string): (() => void) | undefined {
    if (this.state.kind !== 'free') return undefined;
    this.set({ kind: 'lent', to });
    let held = true;
    return () => {
      if (!held) return;
      held = false;
      this.set({ kind: 'free' });
    };
  }

  get stats(): { spare_sequence: SpareState['kind']; spare_sequence_lent_total: number } {
    return { spare_sequence: this.state.kind, spare_sequence_lent_total: this.lentTotal };
  }
}
