import { randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { DEFAULT_BLOCK_SIZE, type BlockHash } from '../protocol/block-hash.js';
import type { KvCacheDeclaration, KvEvent, KvEventBatch, KvSnapshot, TokenizerKind } from '../protocol/kv-events.js';

/** A batch or snapshot as the engine makes it; the worker adds its id when it serves them. */
export type EngineKvBatch = Omit<KvEventBatch, 'worker_id'>;
export type EngineKvSnapshot = Omit<KvSnapshot, 'worker_id'>;

/**
 * The engine side of the KV event stream (protocol/kv-events.ts): an engine with a prefix cache
 * records here what it stored, removed or cleared; the log keeps the set of blocks held (the
 * snapshot a new subscriber starts from), coalesces the events of one event-loop turn into one
 * numbered batch, as vLLM batches per scheduler step, and hands batches to its listeners.
 * While nobody listens nothing is numbered: a subscriber's snapshot carries the seq it continues from.
 */
export class KvEventLog {
  /** Random per engine start: a subscriber that sees another one drops what it knew. */
  readonly incarnation = randomBytes(8).toString('hex');
  private readonly held = new Set<BlockHash>();
  private readonly emitter = new EventEmitter();
  private pending: KvEvent[] = [];
  private scheduled = false;
  private seq = 0;

  constructor(
    readonly blockSize: number = DEFAULT_BLOCK_SIZE,
    readonly tokenizer: TokenizerKind = 'mocker-words',
  ) {}

  /** What the worker's discovery record declares for this cache. */
  get declaration(): KvCacheDeclaration {
    return { block_size: this.blockSize, tokenizer: this.tokenizer, events: 'exact' };
  }

  /** Blocks held now. */
  get size(): number {
    return this.held.size;
  }

  has(hash: BlockHash): boolean {
    return this.held.has(hash);
  }

  /**
   * Blocks stored, in chain order after `parent` (ROOT_BLOCK_HASH for a prompt's first block).
   * Leading blocks already held are skipped (their parent moves along), so a re-store is not news.
   */
  stored(hashes: readonly BlockHash[], parent: BlockHash): void {
    let start = 0;
    while (start < hashes.length && this.held.has(hashes[start] as BlockHash)) parent = hashes[start++] as BlockHash;
    if (start === hashes.length) return;
    const fresh = hashes.slice(start);
    for (const h of fresh) this.held.add(h);
    const last = this.pending.at(-1);
    if (last?.type === 'stored' && last.block_hashes.at(-1) === parent) last.block_hashes.push(...fresh);
    else this.push({ type: 'stored', block_hashes: fresh, parent_block_hash: parent });
  }

  /** Blocks evicted; those not held are ignored. */
  removed(hashes: readonly BlockHash[]): void {
    const gone = hashes.filter((h) => this.held.delete(h));
    if (gone.length === 0) return;
    const last = this.pending.at(-1);
    if (last?.type === 'removed') last.block_hashes.push(...gone);
    else this.push({ type: 'removed', block_hashes: gone });
  }

  /** Every block dropped at once (an engine reset). What was pending before it is moot. */
  cleared(): void {
    this.held.clear();
    this.pending = [];
    this.push({ type: 'cleared' });
  }

  /** Every block held now, and the seq of the last batch it includes (pending events are sent first). */
  snapshot(): EngineKvSnapshot {
    this.flush();
    return { incarnation: this.incarnation, seq: this.seq, block_size: this.blockSize, blocks: [...this.held] };
  }

  onBatch(listener: (batch: EngineKvBatch) => void): () => void {
    this.emitter.on('batch', listener);
    return () => this.emitter.off('batch', listener);
  }

  private push(e: KvEvent): void {
    this.pending.push(e);
    if (this.scheduled) return;
    this.scheduled = true;
    setImmediate(() => this.flush());
  }

  private flush(): void {
    this.scheduled = false;
    if (this.pending.length === 0) return;
    const events = this.pending;
    this.pending = [];
    if (this.emitter.listenerCount('batch') === 0) return;
    this.emitter.emit('batch', { incarnation: this.incarnation, seq: ++this.seq, ts: Date.now(), events } satisfies EngineKvBatch);
  }
}
