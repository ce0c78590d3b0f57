import type { KvLoad } from '../../protocol/kv-events.js';

/** What other frontends have on one worker, as its last `load` event said. */
export interface Others {
  inflight: number;
  prefill: number[];
  /** The prefill list's sum and largest entry: a prompt at least that long waits for the sum (prefillWait without the walk). */
  prefillSum: number;
  prefillMax: number;
}

const isLoad = (v: unknown): v is KvLoad => {
  const l = v as Partial<KvLoad> | null;
  return typeof l === 'object' && l !== null && typeof l.frontends === 'object' && l.frontends !== null;
};

/**
 * The other frontends' requests on each worker (protocol/kv-events.ts KvLoad: in flight there, and
 * the prompts among them not yet prefilled), from the workers' `load` events: the kv router adds
 * them to its own counts, so a worker that other frontends just filled costs here what it costs
 * there. This frontend's own entry is left out (its own counts are exact and newer).
 */
export class SharedLoad {
  private readonly byWorker = new Map<string, Others>();

  constructor(readonly self: string) {}

  /** A worker's `load` event; false when it is not one (malformed entries are skipped). */
  apply(workerId: string, data: unknown): boolean {
    if (!isLoad(data)) return false;
    let inflight = 0;
    let prefillSum = 0;
    let prefillMax = 0;
    const prefill: number[] = [];
    for (const [id, entry] of Object.entries(data.frontends)) {
      if (id === this.self || !Array.isArray(entry)) continue;
      const [n, queued] = entry as [unknown, unknown];
      if (typeof n === 'number' && Number.isFinite(n) && n > 0) inflight += n;
      if (!Array.isArray(queued)) continue;
      for (const q of queued)
        if (typeof q === 'number' && Number.isFinite(q) && q > 0) {
          prefill.push(q);
          prefillSum += q;
          if (q > prefillMax) prefillMax = q;
        }
    }
    if (inflight === 0 && prefill.length === 0) this.byWorker.delete(workerId);
    else this.byWorker.set(workerId, { inflight, prefill, prefillSum, prefillMax });
    return true;
  }

  /** The worker's stream broke (or it is gone): what it said is no longer known. */
  drop(workerId: string): void {
    this.byWorker.delete(workerId);
  }

  /** What the other frontends have on the worker; undefined: nothing (or nothing known). */
  of(workerId: string): Readonly<Others> | undefined {
    return this.byWorker.get(workerId);
  }
}
