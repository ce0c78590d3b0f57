import type { Logger } from 'pino';
import { Unpackr } from 'msgpackr';
import { Dealer, Subscriber } from 'zeromq';
import { chainHash, ROOT_BLOCK_HASH, type BlockHash } from '../protocol/block-hash.js';
import type { KvEventLog } from './kv-event-log.js';

/**
 * vLLM's KV events (vllm/distributed/kv_events.py; SGLang publishes the same family): a ZMQ PUB
 * socket sends multipart messages `[topic, seq (8 bytes, big-endian), payload]`, the payload a
 * msgspec array-like msgpack `[ts, [event, ...], data_parallel_rank?]`, each event a tagged array:
 * `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium?, ...]`,
 * `["BlockRemoved", block_hashes, medium?]`, `["AllBlocksCleared"]`. Engine hashes are the
 * engine's own (ints, or bytes in newer vLLM); ebb's are recomputed from the token ids.
 */

/** An engine's block hash as a map key: ints (any width) by their decimal digits, bytes by their hex. */
type EngineHashKey = string;

function keyOf(h: unknown): EngineHashKey | undefined {
  if (typeof h === 'number' || typeof h === 'bigint') return String(h);
  if (typeof h === 'string') return h; // a 64-bit int, as the decoder gives it (int64AsType: 'string')
  if (h instanceof Uint8Array) return `x${Buffer.from(h).toString('hex')}`;
  return undefined;
}

// 64-bit ints (vLLM's hashes) as exact decimal strings; bin (bytes hashes) as buffers.
const unpackr = new Unpackr({ int64AsType: 'string', mapsAsObjects: true, useRecords: false });

export interface DecodedBatch {
  ts: number;
  events: unknown[][];
}

/** A payload as vLLM encodes an EventBatch; throws on anything else. */
export function decodeKvBatch(payload: Uint8Array): DecodedBatch {
  const batch = unpackr.unpack(payload) as unknown;
  if (!Array.isArray(batch) || batch.length < 2 || !Array.isArray(batch[1])) throw new Error('not an EventBatch ([ts, [events...], dp_rank?])');
  const events = (batch[1] as unknown[]).filter((e): e is unknown[] => Array.isArray(e) && typeof e[0] === 'string');
  return { ts: Number(batch[0]), events };
}

/** Why an engine event was not indexed (counted, and logged once per reason). */
export type SkipReason = 'block_size' | 'unknown_parent' | 'lora' | 'medium' | 'malformed';

/**
 * Translates an engine's block events into ebb's hashes and records them in the worker's KV event
 * log. The engine's hashes are kept, mapped to ebb's, to translate later removals; the map is
 * bounded: the oldest entries beyond `maxBlocks` are forgotten and published as removed (the
 * router then under-counts, never over-counts, what the engine holds).
 */
export class KvEventTranslator {
  private readonly engineToEbb = new Map<EngineHashKey, BlockHash>();
  /** Engine hashes mapped to each ebb hash (LoRA or salt variants of one prefix share it). */
  private readonly refs = new Map<BlockHash, number>();
  readonly skipped = new Map<SkipReason, number>();

  constructor(
    private readonly log: KvEventLog,
    private readonly maxBlocks = 1_000_000,
    private readonly onSkip: (reason: SkipReason, detail: string) => void = () => undefined,
  ) {}

  get size(): number {
    return this.engineToEbb.size;
  }

  apply(event: unknown[]): void {
    switch (event[0]) {
      case 'BlockStored':
        return this.stored(event);
      case 'BlockRemoved':
        return this.removed(event[1], event[2]);
      case 'AllBlocksCleared':
        return this.cleared();
      default:
        return this.skip('malformed', `unknown event ${String(event[0])}`);
    }
  }

  /** Everything known is dropped (AllBlocksCleared, or a gap in the stream: see KvEventSubscriber). */
  cleared(): void {
    this.engineToEbb.clear();
    this.refs.clear();
    this.log.cleared();
  }

  private skip(reason: SkipReason, detail: string): void {
    this.skipped.set(reason, (this.skipped.get(reason) ?? 0) + 1);
    this.onSkip(reason, detail);
  }

  /** Only the engine's own device cache counts: a block offloaded elsewhere is not a prefix it can reuse as is. */
  private onDevice(medium: unknown): boolean {
    return medium === undefined || medium === null || (typeof medium === 'string' && medium.toUpperCase() === 'GPU');
  }

  private stored([, hashes, parent, tokens, blockSize, lora, medium]: unknown[]): void {
    if (!Array.isArray(hashes) || !Array.isArray(tokens) || typeof blockSize !== 'number') return this.skip('malformed', 'BlockStored without block_hashes, token_ids or block_size');
    if (lora !== undefined && lora !== null && lora !== 0) return this.skip('lora', `lora_id ${String(lora)}`);
    if (!this.onDevice(medium)) return this.skip('medium', `medium ${String(medium)}`);
    const size = this.log.blockSize;
    if (blockSize !== size) return this.skip('block_size', `the engine's blocks are ${blockSize} tokens, this worker declares ${size} (--engine-kv-block-size)`);
    let parentEbb: BlockHash;
    if (parent === null || parent === undefined) parentEbb = ROOT_BLOCK_HASH;
    else {
      const known = this.engineToEbb.get(keyOf(parent) ?? '');
      // A chain whose start this worker never saw (it subscribed late, or forgot it): ebb's hash
      // covers the whole prefix, so these blocks cannot be named.
      if (known === undefined) return this.skip('unknown_parent', 'a block whose parent was never stored');
      parentEbb = known;
    }
    const ids = tokens.map(Number);
    const n = Math.min(hashes.length, Math.floor(ids.length / size));
    const chain: BlockHash[] = [];
    let prev = parentEbb;
    for (let i = 0; i < n; i++) {
      const key = keyOf(hashes[i]);
      if (key === undefined) return this.skip('malformed', 'a block hash that is neither an int nor bytes');
      const ebb = chainHash(prev, ids, i * size, (i + 1) * size);
      if (!this.engineToEbb.has(key)) {
        this.engineToEbb.set(key, ebb);
        this.refs.set(ebb, (this.refs.get(ebb) ?? 0) + 1);
      }
      chain.push(ebb);
      prev = ebb;
    }
    if (chain.length > 0) this.log.stored(chain, parentEbb);
    this.bound();
  }

  private removed(hashes: unknown, medium: unknown): void {
    if (!Array.isArray(hashes)) return this.skip('malformed', 'BlockRemoved without block_hashes');
    if (!this.onDevice(medium)) return;
    const gone: BlockHash[] = [];
    for (const h of hashes) {
      const key = keyOf(h);
      const ebb = key === undefined ? undefined : this.engineToEbb.get(key);
      if (ebb === undefined) continue;
      this.engineToEbb.delete(key as EngineHashKey);
      if (this.unref(ebb)) gone.push(ebb);
    }
    if (gone.length > 0) this.log.removed(gone);
  }

  /** True when no engine hash maps to `ebb` any more. */
  private unref(ebb: BlockHash): boolean {
    const n = (this.refs.get(ebb) ?? 1) - 1;
    if (n > 0) {
      this.refs.set(ebb, n);
      return false;
    }
    this.refs.delete(ebb);
    return true;
  }

  private bound(): void {
    if (this.engineToEbb.size <= this.maxBlocks) return;
    const gone: BlockHash[] = [];
    for (const [key, ebb] of this.engineToEbb) {
      if (this.engineToEbb.size <= this.maxBlocks) break;
      this.engineToEbb.delete(key);
      if (this.unref(ebb)) gone.push(ebb);
    }
    if (gone.length > 0) this.log.removed(gone);
  }
}

export interface KvEventSubscriberOptions {
  endpoint: string;
  topic: string;
  /** The publisher's replay socket (vLLM's replay_endpoint, a ROUTER), asked for lost batches. */
  replay?: string | undefined;
  replayTimeoutMs?: number | undefined;
  log: KvEventLog;
  logger: Logger;
  maxBlocks?: number;
}

/**
 * A ZMQ SUB on the engine's KV event publisher. ZMQ reconnects by itself; what a broken or slow
 * connection loses shows as a gap in the publisher's sequence numbers (or a restart: numbers start
 * again at 0). With the publisher's replay socket the lost batches are asked for (live ones are
 * held meanwhile) and applied in order. Otherwise, or when the replay does not reach back far
 * enough (its buffer is bounded) or does not answer, what the worker knows may be wrong: it
 * publishes `cleared` and rebuilds from the events that follow (blocks stored before the gap are
 * not named again until the engine stores them anew; chains whose parent was lost are skipped).
 */
export class KvEventSubscriber {
  private readonly socket = new Subscriber();
  readonly translator: KvEventTranslator;
  private lastSeq: bigint | undefined;
  private closed = false;
  private readonly loop: Promise<void>;
  /** Live messages held while a replay runs. */
  private held: Buffer[][] | undefined;
  /** Batches seen, gaps that cleared the index, gaps a replay filled (for stats). */
  batches = 0;
  gaps = 0;
  replayed = 0;

  constructor(private readonly opts: KvEventSubscriberOptions) {
    const warned = new Set<SkipReason>();
    this.translator = new KvEventTranslator(opts.log, opts.maxBlocks, (reason, detail) => {
      if (warned.has(reason)) return;
      warned.add(reason);
      opts.logger.warn({ event: 'engine_kv_event_skipped', reason }, `an engine KV event was not indexed: ${detail} (logged once per reason)`);
    });
    this.socket.events.on('connect', () => opts.logger.info({ event: 'engine_kv_events_connected', endpoint: opts.endpoint }, `KV events from ${opts.endpoint}`));
    this.socket.events.on('disconnect', () => opts.logger.warn({ event: 'engine_kv_events_disconnected', endpoint: opts.endpoint }, `KV event publisher at ${opts.endpoint} disconnected; reconnecting`));
    this.socket.connect(opts.endpoint);
    this.socket.subscribe(opts.topic);
    this.loop = this.receive();
  }

  private async receive(): Promise<void> {
    try {
      for await (const frames of this.socket) this.onMessage(frames);
    } catch (err) {
      if (!this.closed) this.opts.logger.error({ event: 'engine_kv_events_failed', err }, `reading KV events from ${this.opts.endpoint} failed`);
    }
  }

  private onMessage(frames: Buffer[]): void {
    // [topic, seq, payload]; the topic is matched by the subscription.
    if (frames.length !== 3 || (frames[1] as Buffer).length !== 8) {
      this.opts.logger.warn({ event: 'engine_kv_event_malformed', frames: frames.length }, 'a KV event message is not [topic, seq, payload]');
      return;
    }
    if (this.held) {
      this.held.push(frames);
      return;
    }
    const seq = (frames[1] as Buffer).readBigInt64BE(0);
    if (this.lastSeq !== undefined && seq > this.lastSeq + 1n && this.opts.replay !== undefined) {
      this.held = [frames];
      void this.replay(this.lastSeq + 1n);
      return;
    }
    this.apply(seq, frames[2] as Buffer);
  }

  private apply(seq: bigint, payload: Buffer): void {
    if (this.lastSeq !== undefined && seq !== this.lastSeq + 1n) {
      this.gaps++;
      this.opts.logger.warn(
        { event: 'engine_kv_events_gap', expected: String(this.lastSeq + 1n), got: String(seq) },
        seq <= this.lastSeq ? 'the KV event publisher started over (engine restart?): clearing its index' : `KV event batches ${this.lastSeq + 1n}..${seq - 1n} were lost: clearing the index`,
      );
      this.translator.cleared();
    }
    this.lastSeq = seq;
    let batch: DecodedBatch;
    try {
      batch = decodeKvBatch(payload);
    } catch (err) {
      this.opts.logger.warn({ event: 'engine_kv_event_malformed', err: (err as Error).message }, 'a KV event payload could not be decoded');
      return;
    }
    this.batches++;
    for (const e of batch.events) this.translator.apply(e);
  }

  /**
   * Asks the replay socket for every batch from `from` (vLLM: the start seq as 8 bytes big-endian;
   * it answers [seq, payload] per buffered batch, then seq -1), applies those that fill the gap,
   * then the live messages held meanwhile. Anything short of the whole gap: `cleared`, as without replay.
   */
  private async replay(from: bigint): Promise<void> {
    const dealer = new Dealer({ receiveTimeout: this.opts.replayTimeoutMs ?? 2000, linger: 0 });
    const got: Array<[bigint, Buffer]> = [];
    let answered = false;
    try {
      dealer.connect(this.opts.replay as string);
      const start = Buffer.alloc(8);
      start.writeBigInt64BE(from);
      await dealer.send([Buffer.alloc(0), start]);
      while (!this.closed) {
        const frames = await dealer.receive();
        const seqFrame = frames.at(-2);
        if (seqFrame === undefined || seqFrame.length !== 8) continue;
        const seq = seqFrame.readBigInt64BE(0);
        if (seq === -1n) {
          answered = true;
          break;
        }
        got.push([seq, frames.at(-1) as Buffer]);
      }
    } catch (err) {
      if (!this.closed) this.opts.logger.warn({ event: 'engine_kv_events_replay_failed', err: (err as Error).message }, `the KV event replay at ${this.opts.replay} did not answer`);
    } finally {
      dealer.close();
    }
    if (this.closed) return;
    const held = this.held ?? [];
    this.held = undefined;
    if (answered && got[0] !== undefined && got[0][0] <= from) {
      this.replayed++;
      this.opts.logger.info({ event: 'engine_kv_events_replayed', from: String(from), batches: got.length }, 'lost KV event batches replayed');
      for (const [seq, payload] of got) if (seq === (this.lastSeq as bigint) + 1n) this.apply(seq, payload);
    }
    // What the replay covered is skipped; a gap left (no replay, or too short) clears in apply.
    for (const frames of held) {
      const seq = (frames[1] as Buffer).readBigInt64BE(0);
      if (this.lastSeq !== undefined && seq <= this.lastSeq && seq >= from) continue;
      this.apply(seq, frames[2] as Buffer);
    }
  }

  stats(): Record<string, unknown> {
    return { endpoint: this.opts.endpoint, batches: this.batches, gaps: this.gaps, replayed: this.replayed, engine_blocks: this.translator.size, skipped: Object.fromEntries(this.translator.skipped) };
  }

  async close(): Promise<void> {
    this.closed = true;
    this.socket.close();
    await this.loop;
  }
}
