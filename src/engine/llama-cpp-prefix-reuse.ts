import type { LlamaContext, LlamaContextSequence, Token } from 'node-llama-cpp';
import { blockHashes, ROOT_BLOCK_HASH, type BlockHash } from '../protocol/block-hash.js';

/** Where the blocks the sequences hold are published (the engine's KvEventLog). */
export interface KvBlockSink {
  stored(hashes: readonly BlockHash[], parent: BlockHash): void;
  removed(hashes: readonly BlockHash[]): void;
}

/** One of the context's sequences, kept for its whole life so its KV outlives the request that filled it. */
interface Slot {
  readonly sequence: LlamaContextSequence;
  /** The full blocks of its tokens, as last published. */
  held: BlockHash[];
  busy: boolean;
  /** When it was last given back: ties in overlap go to the least recently used. */
  lastUsed: number;
}

/** A sequence taken for one request: `cached` of its input's leading tokens are already in its KV. */
export interface SequenceLease {
  readonly sequence: LlamaContextSequence;
  readonly cached: number;
  readonly slot: Slot;
}

function commonPrefix(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

/** Lexicographic: the first differing entry decides. */
function outranks(a: readonly number[], b: readonly number[]): boolean {
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return (a[i] as number) > (b[i] as number);
  return false;
}

/**
 * Prompt caching across requests, as llama.cpp's server does with its slots: the context's
 * sequences are never disposed, a request takes the free one whose tokens share the longest
 * prefix with its input, the rest of that sequence is erased and only the remainder is evaluated.
 * The full blocks each sequence holds are published through the engine's KV event log; a block
 * two sequences hold (a shared system prompt) is removed only when the last one lets it go.
 */
export class PrefixSequences {
  private readonly slots: Slot[] = [];
  /** How many sequences hold each block. */
  private readonly holders = new Map<BlockHash, number>();
  private clock = 0;

  constructor(
    context: LlamaContext,
    count: number,
    readonly blockSize: number,
    private readonly sink: KvBlockSink | undefined,
  ) {
    for (let i = 0; i < count; i++) this.slots.push({ sequence: context.getSequence(), held: [], busy: false, lastUsed: 0 });
  }

  /** Sequences taken by requests now. */
  get taken(): number {
    return this.slots.filter((s) => s.busy).length;
  }

  /** Distinct blocks the sequences hold. */
  get cachedBlocks(): number {
    return this.holders.size;
  }

  /**
   * The free sequence with the longest common prefix, trimmed to it. At least one input token is
   * left to evaluate (the model's next-token logits come from evaluating one). `reuse` false: an
   * empty sequence, as without caching. The caller holds a slot of the engine's, so one is free.
   */
  async take(input: readonly Token[], reuse: boolean): Promise<SequenceLease> {
    // Overlap under a block (a shared BOS token) is worth nothing: an empty sequence is then taken
    // before one whose cache would be lost, and among those the least recently used.
    const rank = (slot: Slot, common: number) => [common >= this.blockSize ? common : 0, slot.sequence.nextTokenIndex === 0 ? 1 : 0, -slot.lastUsed];
    let best: Slot | undefined;
    let bestCommon = 0;
    let bestRank: number[] = [];
    for (const slot of this.slots) {
      if (slot.busy) continue;
      const common = reuse ? commonPrefix(slot.sequence.contextTokens, input) : 0;
      const r = rank(slot, common);
      if (best === undefined || outranks(r, bestRank)) {
        best = slot;
        bestCommon = common;
        bestRank = r;
      }
    }
    if (best === undefined) throw new Error('no free llama.cpp sequence (more requests than --parallel, or than --parallel + its spare sequence, were let through)');
    best.busy = true;
    const keep = Math.max(0, Math.min(bestCommon, input.length - 1));
    const seq = best.sequence;
    try {
      if (keep < seq.nextTokenIndex) await seq.eraseContextTokenRanges([{ start: keep, end: seq.nextTokenIndex }]);
    } catch (err) {
      best.busy = false;
      throw err;
    }
    this.publish(best);
    // What the sequence really kept: a model that cannot erase a suffix (sliding-window attention,
    // recurrent state) starts over, and llama.cpp then evaluates the whole input.
    return { sequence: seq, cached: Math.min(seq.nextTokenIndex, keep), slot: best };
  }

  /**
   * The sequence goes back with its tokens (the cache). After an engine error its state is not
   * trusted: it is cleared.
   */
  async give(lease: SequenceLease, failed: boolean): Promise<void> {
    const { slot } = lease;
    if (failed) await slot.sequence.clearHistory().catch(() => undefined);
    this.publish(slot);
    slot.lastUsed = ++this.clock;
    slot.busy = false;
  }

  /**
   * Empties a taken sequence (to load another state into it, or after a failed load), and publishes
   * that its blocks are gone.
   */
  async clear(lease: SequenceLease): Promise<void> {
    await lease.sequence.clearHistory();
    this.publish(lease);
  }

  /** Publishes the difference between what the sequence held and what it holds now. */
  publish(slotOrLease: Slot | SequenceLease): void {
    const slot = 'slot' in slotOrLease ? slotOrLease.slot : slotOrLease;
    const now = blockHashes(slot.sequence.contextTokens, this.blockSize);
    const before = slot.held;
    let same = 0;
    while (same < before.length && same < now.length && before[same] === now[same]) same++;
    const gone: BlockHash[] = [];
    for (let i = same; i < before.length; i++) {
      const h = before[i] as BlockHash;
      const n = (this.holders.get(h) ?? 1) - 1;
      if (n > 0) this.holders.set(h, n);
      else {
        this.holders.delete(h);
        gone.push(h);
      }
    }
    if (gone.length > 0) this.sink?.removed(gone);
    // Blocks new to the engine come in chain runs; one another sequence already holds is not news.
    let run: BlockHash[] = [];
    let parent: BlockHash = same > 0 ? (now[same - 1] as BlockHash) : ROOT_BLOCK_HASH;
    const flush = () => {
      if (run.length > 0) this.sink?.stored(run, parent);
      run = [];
    };
    for (let i = same; i < now.length; i++) {
      const h = now[i] as BlockHash;
      const n = this.holders.get(h) ?? 0;
      this.holders.set(h, n + 1);
      if (n === 0) run.push(h);
      else {
        flush();
        parent = h;
      }
    }
    flush();
    slot.held = now;
  }
}
