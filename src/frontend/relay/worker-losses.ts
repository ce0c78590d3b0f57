import { EbbError } from '../../protocol/errors.js';

/**
 * The workers one request broke: each that died, went silent or had its engine fail under it after
 * taking it (a refusal, a refused connection, a hand-off or a worker's own shutdown are not that).
 *
 * The rule: a request may lose one worker and is sent on (before its first token, or continued
 * mid-stream); the second loss ends it with `request_broke_workers`, and no third worker gets it.
 * One loss is most often the worker's own (an OOM from other load, a node lost, a kill), and ebb's
 * promise is that such a crash loses no admitted request, so it is retried. Two workers lost under
 * the same request in its lifetime is far likelier its own doing (an input that crashes or wedges
 * every engine: a 477-byte schema wedged 3 of 3 workers in 12 s) than chance; sending it on would
 * take the fleet down one worker at a time. Failing one request with an explicit error, which its
 * client may retry, is the cheap side of that bet.
 *
 * One per sequence (lane), across its attempts before the first token and its migrations: the
 * lane is its one owner.
 */
export class WorkerLosses {
  /** Losses a request survives: the next one ends it. */
  static readonly SURVIVED = 1;
  private readonly lost: string[] = [];

  get count(): number {
    return this.lost.length;
  }

  /** One more worker lost under the request; throws its verdict once that is one too many. */
  record(workerId: string, why: string): void {
    this.lost.push(`${workerId}: ${why}`);
    if (this.lost.length > WorkerLosses.SURVIVED) throw this.verdict();
  }

  private verdict(): EbbError {
    return new EbbError(
      'request_broke_workers',
      `${this.lost.length} workers failed under this request one after the other (${this.lost.join('; ')}); it is not sent to another, as the request itself may be what breaks them`,
    );
  }
}
