import type { Counts } from './messages.js';

/**
 * The primary's record of every child's in-flight counts per worker, so that each child can rank
 * workers by what the whole frontend has on them, not only by its own requests (least-loaded would
 * herd otherwise: N processes each seeing an idle worker send it N requests).
 *
 * Children report absolute counts for the workers that changed; the primary answers each child with
 * the sum of the *other* children's counts, for the workers whose sum changed. Both sides coalesce
 * per event-loop turn, so a child's view of its peers is one IPC round trip old (sub-millisecond
 * idle; about one event-loop turn of each process under load). Its own count is always exact.
 */
export class InflightTable {
  private readonly byChild = new Map<number, Map<string, number>>();
  private readonly totals = new Map<string, number>();
  /** Workers whose total changed since the last `flush`. */
  private readonly dirty = new Set<string>();

  /** A child's report. */
  report(child: number, counts: Counts): void {
    let mine = this.byChild.get(child);
    if (!mine) this.byChild.set(child, (mine = new Map()));
    for (const [worker, n] of counts) {
      const before = mine.get(worker) ?? 0;
      if (n === before) continue;
      if (n === 0) mine.delete(worker);
      else mine.set(worker, n);
      this.add(worker, n - before);
    }
  }

  /** A child is gone: its requests are gone with it. */
  forget(child: number): void {
    const mine = this.byChild.get(child);
    if (!mine) return;
    this.byChild.delete(child);
    for (const [worker, n] of mine) this.add(worker, -n);
  }

  private add(worker: string, by: number): void {
    const n = (this.totals.get(worker) ?? 0) + by;
    if (n === 0) this.totals.delete(worker);
    else this.totals.set(worker, n);
    this.dirty.add(worker);
  }

  total(worker: string): number {
    return this.totals.get(worker) ?? 0;
  }

  /** What `child`'s peers have open on each of `workers` (all known workers when omitted). */
  peersOf(child: number, workers: Iterable<string> = this.totals.keys()): Counts {
    const mine = this.byChild.get(child);
    const out: Counts = [];
    for (const w of workers) out.push([w, this.total(w) - (mine?.get(w) ?? 0)]);
    return out;
  }

  /** The workers whose totals changed since the last call. */
  flush(): string[] {
    const out = [...this.dirty];
    this.dirty.clear();
    return out;
  }
}
