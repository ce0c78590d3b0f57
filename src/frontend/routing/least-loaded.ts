/**
 * The workers of one (model, mode), ordered by in-flight requests and then by when each was last
 * picked: least in-flight first, and among equals the one picked longest ago, which is what makes
 * ties rotate (round robin) across an idle fleet. A binary heap: picking is O(log n), and so is
 * every in-flight change; a pick that must skip workers (tried, held, lacking a capability) visits
 * them best-first, so it costs O(k log k) in the k skipped, not O(n).
 */
export interface Ranked {
  /** Requests open on it, as far as this process knows (its own, plus what peer processes report). */
  readonly load: number;
  /** When it was last picked (a pool-wide counter); the tie-break. */
  pickedAt: number;
  /** Its slot in the heap, -1 when in none; owned by the heap. */
  slot: number;
}

const before = (a: Ranked, b: Ranked): boolean => a.load < b.load || (a.load === b.load && a.pickedAt < b.pickedAt);

export class LeastLoaded<T extends Ranked> {
  private readonly heap: T[] = [];
  /** Reused by best(): candidate slots still to visit, kept as a heap. */
  private readonly frontier: number[] = [];

  get size(): number {
    return this.heap.length;
  }

  values(): readonly T[] {
    return this.heap;
  }

  add(w: T): void {
    w.slot = this.heap.length;
    this.heap.push(w);
    this.up(w.slot);
  }

  delete(w: T): void {
    const i = w.slot;
    if (i < 0 || this.heap[i] !== w) return;
    const last = this.heap.pop() as T;
    w.slot = -1;
    if (last === w) return;
    this.heap[i] = last;
    last.slot = i;
    this.fix(i);
  }

  /** Re-places `w` after its load or pickedAt changed. */
  update(w: T): void {
    if (w.slot >= 0 && this.heap[w.slot] === w) this.fix(w.slot);
  }

  /** The best worker that `eligible` accepts, visiting heap slots in order; undefined when none. */
  best(eligible: (w: T) => boolean): T | undefined {
    const heap = this.heap;
    if (heap.length === 0) return undefined;
    const root = heap[0] as T;
    if (eligible(root)) return root; // the hot path: nothing to skip
    const f = this.frontier;
    f.length = 0;
    const push = (i: number) => {
      if (i >= heap.length) return;
      f.push(i);
      let c = f.length - 1;
      while (c > 0) {
        const p = (c - 1) >> 1;
        if (!before(heap[f[c] as number] as T, heap[f[p] as number] as T)) break;
        [f[c], f[p]] = [f[p] as number, f[c] as number];
        c = p;
      }
    };
    const pop = (): number => {
      const top = f[0] as number;
      const last = f.pop() as number;
      if (f.length > 0) {
        f[0] = last;
        let c = 0;
        for (;;) {
          const l = 2 * c + 1;
          const r = l + 1;
          let m = c;
          if (l < f.length && before(heap[f[l] as number] as T, heap[f[m] as number] as T)) m = l;
          if (r < f.length && before(heap[f[r] as number] as T, heap[f[m] as number] as T)) m = r;
          if (m === c) break;
          [f[c], f[m]] = [f[m] as number, f[c] as number];
          c = m;
        }
      }
      return top;
    };
    push(1);
    push(2);
    while (f.length > 0) {
      const i = pop();
      const w = heap[i] as T;
      if (eligible(w)) return w;
      push(2 * i + 1);
      push(2 * i + 2);
    }
    return undefined;
  }

  private fix(i: number): void {
    if (i > 0 && before(this.heap[i] as T, this.heap[(i - 1) >> 1] as T)) this.up(i);
    else this.down(i);
  }

  private up(i: number): void {
    const heap = this.heap;
    const w = heap[i] as T;
    while (i > 0) {
      const p = (i - 1) >> 1;
      const parent = heap[p] as T;
      if (!before(w, parent)) break;
      heap[i] = parent;
      parent.slot = i;
      i = p;
    }
    heap[i] = w;
    w.slot = i;
  }

  private down(i: number): void {
    const heap = this.heap;
    const n = heap.length;
    const w = heap[i] as T;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= n) break;
      const r = l + 1;
      const c = r < n && before(heap[r] as T, heap[l] as T) ? r : l;
      const child = heap[c] as T;
      if (!before(child, w)) break;
      heap[i] = child;
      child.slot = i;
      i = c;
    }
    heap[i] = w;
    w.slot = i;
  }
}
