import { request, type Agent } from 'undici';
import type { PoolWorker, WorkerPool } from '../routing/worker-pool.js';
import { WorkerUnresponsive } from './worker-answer.js';
import type { WorkerCall } from './worker-call.js';

/**
 * A committed stream's liveness: a stream silent for `streamIdleTimeoutMs` has its worker's /live
 * probed, and only a worker that does not answer that either is hung (stopped, wedged): it is held
 * out and the stream destroyed, so the relay moves it on.
 */
export class IdleWatch {
  /** One /live probe in flight per worker, shared by all its silent streams (see answersLive). */
  private readonly liveProbes = new Map<string, Promise<boolean>>();

  constructor(
    private readonly agent: Agent,
    private readonly pool: WorkerPool,
    private readonly streamIdleTimeoutMs: number,
  ) {}

  /**
   * Whether a worker that went quiet still answers its liveness probe (a SIGSTOPped process does not).
   * Streams waiting on the same worker share one probe: hundreds of silent streams opened hundreds of
   * probe connections at once to a system port whose budget is 64.
   */
  private answersLive(w: PoolWorker): Promise<boolean> {
    const url = w.record.system_url;
    let probe = this.liveProbes.get(url);
    if (probe === undefined) {
      probe = this.probeLive(w).finally(() => this.liveProbes.delete(url));
      this.liveProbes.set(url, probe);
    }
    return probe;
  }

  private async probeLive(w: PoolWorker): Promise<boolean> {
    const bound = Math.min(this.streamIdleTimeoutMs, 2000);
    try {
      const res = await request(`${w.record.system_url}/live`, { dispatcher: this.agent, signal: AbortSignal.timeout(bound), headersTimeout: bound, bodyTimeout: bound });
      await res.body.dump();
      return res.statusCode === 200;
    } catch {
      return false;
    }
  }

  /**
   * Silence is not failure: a stream may wait long between tokens. Only silence from a worker that
   * no longer answers /live is, and then the stream is destroyed so the relay moves it on.
   */
  watch(worker: PoolWorker, call: WorkerCall): () => void {
    const ms = this.streamIdleTimeoutMs;
    if (ms <= 0) return () => undefined;
    let stopped = false;
    const timer = setTimeout(() => {
      // Bytes since the last look: not idle; look again in `ms` (so silence is seen within 2 x ms).
      if (call.sawBytes) {
        call.sawBytes = false;
        timer.refresh();
        return;
      }
      void this.answersLive(worker).then((live) => {
        if (stopped) return;
        if (live) {
          timer.refresh();
          return;
        }
        stopped = true;
        this.pool.hold(worker.record.worker_id, 'unreachable');
        call.abort(new WorkerUnresponsive(worker.record.worker_id, ms));
      });
    }, ms);
    call.sawBytes = false;
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }
}
