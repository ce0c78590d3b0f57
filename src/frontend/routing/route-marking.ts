import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import type { Logger } from 'pino';
import { Backoff, pause } from '../../common/backoff.js';
import type { RouteMarks } from '../../discovery/route-marks.js';

const RETRY = { minMs: 250, maxMs: 5000, jitter: true };

/** This frontend process's id in the marks: its host, pid and a nonce (a restart is a new frontend). */
export function newFrontendId(): string {
  return `f-${hostname().replace(/[^\w.-]/g, '_')}-${process.pid}-${randomBytes(3).toString('hex')}`;
}

/**
 * Marks in discovery which workers this frontend routes to: the ids in its routing view (the pool,
 * as discovery events left it), written after the view's first read and again whenever it changes,
 * coalesced to one write per turn; a failed write is retried until one lands. Workers read every
 * frontend's mark to say they are ready (worker/routed-by.ts).
 */
export class RouteMarking {
  private readonly stop = new AbortController();
  private dirty = false;
  private writing = false;
  private written: string | undefined;

  constructor(
    private readonly marks: RouteMarks,
    readonly frontendId: string,
    private readonly workers: () => string[],
    private readonly log: Logger,
  ) {}

  /** The routing view changed (a discovery event was applied to it). */
  changed(): void {
    this.dirty = true;
    if (this.writing || this.stop.signal.aborted) return;
    this.writing = true;
    setImmediate(() => void this.flush());
  }

  private async flush(): Promise<void> {
    const backoff = new Backoff(RETRY);
    while (this.dirty && !this.stop.signal.aborted) {
      this.dirty = false;
      const workers = this.workers().sort();
      const key = workers.join('\n');
      if (key === this.written) continue;
      try {
        await this.marks.publish({ frontend_id: this.frontendId, workers });
        this.written = key;
        backoff.reset();
      } catch (err) {
        this.dirty = true;
        const delay = backoff.next();
        this.log.warn({ event: 'route_mark_failed', err: (err as Error).message, retry_in_ms: delay }, `could not mark the workers this frontend routes to: ${(err as Error).message}`);
        if (!(await pause(delay, this.stop.signal))) break;
      }
    }
    this.writing = false;
  }

  /** No more writes; discovery's close removes the mark. */
  close(): void {
    this.stop.abort();
  }
}
