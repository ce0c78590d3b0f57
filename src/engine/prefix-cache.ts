import { blockHashes, ROOT_BLOCK_HASH, type BlockHash } from '../protocol/block-hash.js';
import type { KvEventLog } from './kv-event-log.js';
import type { KvCacheStats } from './engine.js';

/**
 * A simulated engine's paged prefix cache, as vLLM's prefix caching keeps it: a prompt's full
 * blocks are identified by their hash chain (protocol/block-hash.ts); a running sequence pins its
 * blocks; a finished sequence's blocks stay cached, evictable, and the least recently used one goes
 * first when a new block needs room (a sequence's tail before its head, so a shared prefix
 * outlives the documents hung on it). Every block stored or evicted is recorded in the KV event log.
 */
export class PrefixCache {
  /** Every block held, with how many running sequences pin it. */
  private readonly pins = new Map<BlockHash, number>();
  /** Blocks no sequence pins, least recently used first (a Set keeps insertion order). */
  private readonly evictable = new Set<BlockHash>();
  /** Prompt tokens found cached, and prefilled, since the engine started. */
  hitTokens = 0;
  missTokens = 0;

  constructor(
    readonly capacity: number,
    readonly blockSize: number,
    private readonly log: KvEventLog,
  ) {}

  /** What GET /engine/status shows (kv_cache.cached_blocks is read by others as the worker's cache value). */
  stats(): KvCacheStats {
    const seen = this.hitTokens + this.missTokens;
    return {
      block_size: this.blockSize,
      capacity_blocks: this.capacity,
      cached_blocks: this.pins.size,
      pinned_blocks: this.pins.size - this.evictable.size,
      prompt_tokens_hit: this.hitTokens,
      prompt_tokens_missed: this.missTokens,
      hit_rate: seen === 0 ? 0 : this.hitTokens / seen,
    };
  }

  /** Blocks held now (pinned or not). */
  get size(): number {
    return this.pins.size;
  }

  /**
   * A sequence starts: the longest cached prefix of its prompt is pinned and counted as a hit.
   * As vLLM does, the last prompt token is always computed, so a prompt that is whole blocks
   * never hits its last block.
   */
  begin(promptTokens: readonly number[], root: BlockHash = ROOT_BLOCK_HASH): CachedSequence {
    const seq = new CachedSequence(this, promptTokens, root);
    const usable = Math.floor(Math.max(0, promptTokens.length - 1) / this.blockSize);
    let hit = 0;
    while (hit < usable && this.pins.has(seq.hashes[hit] as BlockHash)) hit++;
    seq.pinAll(seq.hashes.slice(0, hit));
    seq.cachedTokens = hit * this.blockSize;
    this.hitTokens += seq.cachedTokens;
    this.missTokens += promptTokens.length - seq.cachedTokens;
    return seq;
  }

  /** @internal Pins a held block; false when it is not held. */
  pin(h: BlockHash): boolean {
    const n = this.pins.get(h);
    if (n === undefined) return false;
    this.pins.set(h, n + 1);
    this.evictable.delete(h);
    return true;
  }

  /** @internal Unpins; a block no sequence pins becomes the most recently used evictable one. */
  unpin(h: BlockHash): void {
    const n = this.pins.get(h);
    if (n === undefined) return;
    if (n > 1) this.pins.set(h, n - 1);
    else {
      this.pins.set(h, 0);
      this.evictable.add(h);
    }
  }

  /**
   * @internal Stores (pinned) the blocks of `chain` from index `from` that are not held, evicting
   * what is needed first; returns the blocks stored. Stops where nothing is left to evict (every
   * block pinned by running sequences): the rest is computed but not cached.
   */
  store(chain: readonly BlockHash[], from: number, pinned: Set<BlockHash>, root: BlockHash = ROOT_BLOCK_HASH): BlockHash[] {
    const missing: number[] = [];
    for (let i = from; i < chain.length; i++) if (!this.pins.has(chain[i] as BlockHash)) missing.push(i);
    const need = this.pins.size + missing.length - this.capacity;
    if (need > 0) {
      const victims: BlockHash[] = [];
      for (const h of this.evictable) {
        if (victims.length === need) break;
        victims.push(h);
      }
      for (const h of victims) {
        this.evictable.delete(h);
        this.pins.delete(h);
      }
      this.log.removed(victims);
    }
    const stored: BlockHash[] = [];
    let run: BlockHash[] = [];
    let runParent = root;
    for (const i of missing) {
      if (this.pins.size >= this.capacity) break;
      const h = chain[i] as BlockHash;
      const parent = i === 0 ? root : (chain[i - 1] as BlockHash);
      if (run.length > 0 && run.at(-1) !== parent) {
        this.log.stored(run, runParent);
        run = [];
      }
      if (run.length === 0) runParent = parent;
      run.push(h);
      this.pins.set(h, 1);
      pinned.add(h);
      stored.push(h);
    }
    if (run.length > 0) this.log.stored(run, runParent);
    return stored;
  }
}

/** One sequence's hold on the cache, from its start to its end. */
export class CachedSequence {
  readonly hashes: BlockHash[];
  /** Prompt tokens found cached at the start (whole blocks). */
  cachedTokens = 0;
  /** Tokens the sequence starts with. */
  readonly tokens: number;
  /** The blocks this sequence pins. */
  private readonly pinned = new Set<BlockHash>();
  private ended = false;

  constructor(
    private readonly cache: PrefixCache,
    private readonly promptTokens: readonly number[],
    /** adapterRoot's: a LoRA adapter's blocks are its own. */
    private readonly root: BlockHash = ROOT_BLOCK_HASH,
  ) {
    this.hashes = blockHashes(promptTokens, cache.blockSize, root);
    this.tokens = promptTokens.length;
  }

  /** @internal */
  pinAll(hashes: readonly BlockHash[]): void {
    for (const h of hashes) if (!this.pinned.has(h) && this.cache.pin(h)) this.pinned.add(h);
  }

  /** The prompt is computed: its full blocks are cached (those held already are pinned). */
  prefilled(): void {
    this.pinAll(this.hashes);
    this.cache.store(this.hashes, 0, this.pinned, this.root);
  }

  /**
   * The sequence ends. With `generated` (the completion's token ids, for a sequence that finished)
   * the completion's full blocks are cached too, as vLLM keeps them, so the next turn of a
   * conversation finds them. Then every block is released, the tail first.
   */
  end(generated?: readonly number[]): void {
    if (this.ended) return;
    this.ended = true;
    let chain = this.hashes;
    if (generated !== undefined && generated.length > 0) {
      chain = blockHashes([...this.promptTokens, ...generated], this.cache.blockSize, this.root);
      this.pinAll(chain);
      this.cache.store(chain, this.hashes.length, this.pinned, this.root);
    }
    for (let i = chain.length - 1; i >= 0; i--) if (this.pinned.delete(chain[i] as BlockHash)) this.cache.unpin(chain[i] as BlockHash);
    for (const h of this.pinned) this.cache.unpin(h);
    this.pinned.clear();
  }
}
