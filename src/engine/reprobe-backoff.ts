import { Backoff } from '../common/backoff.js';

/**
 * The one poll in ebb. An engine in its own process (vLLM, SGLang, llama-server) sends no event
 * when its last sequence ends or its queue empties: it only answers when asked. So after a probe
 * answered "not idle" with nothing of ebb's in flight, the adapter asks again: this schedule fires
 * a change event (the lifecycle then probes) after a short delay that doubles up to a cap. It only
 * runs while someone waits: the lifecycle probes only while draining with nothing in flight, so a
 * resume, or an idle answer, ends it; new work resets it.
 */
export class ReprobeBackoff {
  private timer: NodeJS.Timeout | undefined;
  private readonly backoff: Backoff;

  constructor(
    private readonly fire: () => void,
    minMs = 100,
    maxMs = 2000,
  ) {
    this.backoff = new Backoff({ minMs, maxMs });
  }

  /** After a not-idle answer: ask again later (one pending re-probe at most). */
  schedule(): void {
    if (this.timer !== undefined) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.fire();
    }, this.backoff.next());
    this.timer.unref();
  }

  /** An idle answer, or new work: nobody waits on the engine any more; the next wait starts short. */
  reset(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    this.backoff.reset();
  }
}
