import type { BlockHash } from '../../protocol/block-hash.js';

/**
 * What the frontend knows of one worker incarnation's prefix cache. `exact`: the blocks its engine
 * published on /kv/events; `approximate`: the blocks of prompts this frontend sent it, each until
 * its expiry (engines that publish nothing).
 */
export class Holder {
  /** Block hash -> expiry (ms since epoch; Infinity for exact entries). Insertion order is refresh order. */
  readonly blocks = new Map<BlockHash, number>();
  /** Not in the routing view (draining, drained, left discovery): kept, never scored. */
  masked = false;
  /** When its worker last said it stored blocks (performance.now()): the same moment for every frontend. */
  storedAt = 0;
  /** The most blocks its cache holds, as its snapshot said (0: not said). */
  capacityBlocks = 0;
  /**
   * log2 of the blocks it stored lately (halved every RECENT_HALF_LIFE_MS), as if counted at time
   * 0: comparable across holders at any moment without decaying each (KvIndex.recentMax).
   */
  recentLog = -Infinity;
  /** Per-query scratch: the query that last touched it and how many leading blocks it holds. */
  stamp = 0;
  depth = 0;

  constructor(
    readonly workerId: string,
    readonly model: string,
    readonly kind: 'exact' | 'approximate',
    /** The engine's incarnation (exact), or the frontend's own for approximate holders. */
    readonly incarnation: string,
  ) {}


  /**
   * Blocks it stored lately, as of `now`: what its cache holds of the prompts that are alive there
   * (a conversation's blocks are stored when it starts and at each turn), the same figure at every
   * frontend, since they all read the same events.
   */
  recentBlocks(now: number): number {
    return this.recentLog === -Infinity ? 0 : Math.pow(2, this.recentLog - now / RECENT_HALF_LIFE_MS);
  }
}

/** How fast a stored block stops counting as alive in its cache (Holder.recentBlocks). */
export const RECENT_HALF_LIFE_MS = 5_000;

/** One holder, or several: most blocks are held by one worker, and a Set per block would cost ~100 bytes each. */
type Holders = Holder | Holder[];

/**
 * Per model: block hash -> the worker incarnations holding it. A worker has at most one holder at a
 * time; replacing it (a new incarnation, a fresh snapshot after a gap) or dropping it removes every
 * entry it had, so nothing stays behind for workers that are gone.
 */
export class KvIndex {
  private readonly byModel = new Map<string, Map<BlockHash, Holders>>();
  private readonly byWorker = new Map<string, Holder>();
  /** Per model, the largest Holder.recentLog (a holder since replaced may hold it: it decays as the others). */
  private readonly recentLogMax = new Map<string, number>();
  private stamp = 0;

  /** The current holder of `workerId`, if any. */
  holder(workerId: string): Holder | undefined {
    return this.byWorker.get(workerId);
  }

  /** A fresh, empty holder for `workerId`, replacing (and purging) any it had. */
  replace(workerId: string, model: string, kind: Holder['kind'], incarnation: string): Holder {
    this.drop(workerId);
    const h = new Holder(workerId, model, kind, incarnation);
    this.byWorker.set(workerId, h);
    return h;
  }

  /** Forgets everything `workerId` held. */
  drop(workerId: string): void {
    const h = this.byWorker.get(workerId);
    if (!h) return;
    this.clear(h);
    this.byWorker.delete(workerId);
  }

  /** Every worker's current holder. */
  holders(): IterableIterator<[string, Holder]> {
    return this.byWorker.entries();
  }

  get workers(): number {
    return this.byWorker.size;
  }

  /** Indexed (block, holder) entries, across models. */
  get entries(): number {
    let n = 0;
    for (const h of this.byWorker.values()) n += h.blocks.size;
    return n;
  }

  /** Distinct indexed blocks of `model`. */
  blocksOf(model: string): number {
    return this.byModel.get(model)?.size ?? 0;
  }

  add(h: Holder, hash: BlockHash, expiresAt = Infinity): void {
    if (this.byWorker.get(h.workerId) !== h) return; // a replaced holder's late events
    const had = h.blocks.has(hash);
    if (had) h.blocks.delete(hash); // to the back: refresh order
    h.blocks.set(hash, expiresAt);
    if (had) return;
    let map = this.byModel.get(h.model);
    if (!map) this.byModel.set(h.model, (map = new Map()));
    const cur = map.get(hash);
    if (cur === undefined) map.set(hash, h);
    else if (Array.isArray(cur)) cur.push(h);
    else map.set(hash, [cur, h]);
  }

  /** `h`'s worker said it stored `n` blocks at `now` (performance.now()). */
  stored(h: Holder, n: number, now: number): void {
    h.recentLog = Math.log2(h.recentBlocks(now) + n) + now / RECENT_HALF_LIFE_MS;
    h.storedAt = now;
    if (!(h.recentLog <= (this.recentLogMax.get(h.model) ?? -Infinity))) this.recentLogMax.set(h.model, h.recentLog);
  }

  /** The most blocks any holder of `model` stored lately, as of `now`: a decision reads it without visiting every worker. */
  recentMax(model: string, now: number): number {
    const log = this.recentLogMax.get(model);
    return log === undefined ? 0 : Math.pow(2, log - now / RECENT_HALF_LIFE_MS);
  }

  remove(h: Holder, hash: BlockHash): void {
    if (!h.blocks.delete(hash)) return;
    const map = this.byModel.get(h.model);
    const cur = map?.get(hash);
    if (!map || cur === undefined) return;
    if (cur === h) map.delete(hash);
    else if (Array.isArray(cur)) {
      const i = cur.indexOf(h);
      if (i >= 0) cur.splice(i, 1);
      if (cur.length === 1) map.set(hash, cur[0] as Holder);
      else if (cur.length === 0) map.delete(hash);
    }
    if (map.size === 0) this.byModel.delete(h.model);
  }

  /** Every entry of `h` gone (a `cleared` event); the holder stays current. */
  clear(h: Holder): void {
    for (const hash of [...h.blocks.keys()]) this.remove(h, hash);
  }

  /**
   * Drops `h`'s entries that expired by `now` and its oldest ones past `bound`. Approximate holders
   * only: their entries are kept in refresh order, so the oldest are first.
   */
  trim(h: Holder, now: number, bound: number): void {
    for (const [hash, expiry] of h.blocks) {
      if (expiry > now && h.blocks.size <= bound) break;
      this.remove(h, hash);
    }
  }

  /**
   * How many leading blocks of `hashes` each holder of `model` has (non-expired at `now`). Block by
   * block, each holder listed for the block advances when it held every block before it; the walk
   * stops at the first block that advances nobody. It reads the per-block holder lists (arrays),
   * never the holders' own maps, except for approximate entries' expiry. Read the answer with
   * overlap() before the next query.
   */
  query(model: string, hashes: readonly BlockHash[], now = Date.now()): number {
    const q = ++this.stamp;
    const map = this.byModel.get(model);
    if (!map) return q;
    for (let i = 0; i < hashes.length; i++) {
      const hash = hashes[i] as BlockHash;
      const entry = map.get(hash);
      if (entry === undefined) break;
      let advanced = 0;
      if (Array.isArray(entry)) {
        for (const h of entry) if (this.advance(h, i, q, hash, now)) advanced++;
      } else if (this.advance(entry, i, q, hash, now)) advanced++;
      if (advanced === 0) break;
    }
    return q;
  }

  private advance(h: Holder, i: number, q: number, hash: BlockHash, now: number): boolean {
    if (i > 0 && (h.stamp !== q || h.depth !== i)) return false;
    if (h.kind === 'approximate' && !((h.blocks.get(hash) ?? 0) > now)) return false;
    h.stamp = q;
    h.depth = i + 1;
    return true;
  }

  /** Leading blocks `workerId` holds, as found by query `q`. */
  overlap(q: number, workerId: string): number {
    const h = this.byWorker.get(workerId);
    return h !== undefined && h.stamp === q ? h.depth : 0;
  }
}
