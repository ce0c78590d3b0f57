/**
 * Flex decodes held back while a priority request gets its first token (llama-cpp).
 *
 * node-llama-cpp runs every decode of a context in one loop that holds the context's lock until its
 * queue is empty, and the sequences of running streams queue their next token as soon as they have
 * one: with flex streams in every other sequence the queue is never empty. What a priority request
 * needs before its prefill (erasing its sequence's old tokens) and what a paused stream needs before
 * its slot goes back (writing its state file) take that same lock, so they waited for a moment when
 * no flex stream had a token queued, and its prefill then shared the one CPU thread with their
 * decodes. While the gate is held a flex sequence does not ask for its next token (its generator's
 * next() is what queues it); the decodes already queued end, the loop lets go of the lock, and the
 * priority request's work runs alone. Held by a priority request from its slot to its first token,
 * and by a sequence going back while a priority request waits for a slot; each holder lets go on
 * every way it ends. A held gate waits for work that needs no flex token, so it always opens.
 */
type GateState = { kind: 'open' } | { kind: 'held'; holders: number; opened: Promise<void>; open: () => void };

export class PriorityGate {
  private state: GateState = { kind: 'open' };
  /**
   * Flex tokens that reached their stream while the gate was held: those whose decode was already
   * queued when it closed, at most one per flex sequence each time (GET /engine/status shows it).
   */
  private flexTokensWhileHeld = 0;

  private set(next: GateState): void {
    const was = this.state;
    this.state = next;
    if (was.kind === 'held' && next.kind === 'open') was.open();
  }

  /** Holds the gate until the returned function is called (once; later calls do nothing). */
  hold(): () => void {
    const s = this.state;
    if (s.kind === 'held') this.set({ ...s, holders: s.holders + 1 });
    else {
      let open!: () => void;
      const opened = new Promise<void>((resolve) => (open = resolve));
      this.set({ kind: 'held', holders: 1, opened, open });
    }
    let held = true;
    return () => {
      if (!held) return;
      held = false;
      const now = this.state;
      if (now.kind !== 'held') return;
      this.set(now.holders > 1 ? { ...now, holders: now.holders - 1 } : { kind: 'open' });
    };
  }

  /** Resolves once the gate is open (at once if it is); rejects with the abort reason if `signal` aborts first. */
  passed(signal: AbortSignal): Promise<void> {
    const s = this.state;
    if (s.kind === 'open') return Promise.resolve();
    if (signal.aborted) return Promise.reject(signal.reason);
    return new Promise<void>((resolve, reject) => {
      const onAbort = () => reject(signal.reason);
      signal.addEventListener('abort', onAbort, { once: true });
      void s.opened.then(() => {
        signal.removeEventListener('abort', onAbort);
        resolve();
      });
    });
  }

  /** A flex token reached its stream. */
  flexToken(): void {
    if (this.state.kind === 'held') this.flexTokensWhileHeld++;
  }

  get stats(): { priority_gate_held: boolean; flex_tokens_while_priority_gate_held: number } {
    return { priority_gate_held: this.state.kind === 'held', flex_tokens_while_priority_gate_held: this.flexTokensWhileHeld };
  }
}
