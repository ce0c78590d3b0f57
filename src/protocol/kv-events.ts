import type { BlockHash } from './block-hash.js';

/**
 * What a worker's engine stored in and evicted from its prefix cache, modelled on vLLM's KV event
 * batches (BlockStored / BlockRemoved / AllBlocksCleared). Hashes are ebb's (protocol/block-hash.ts).
 *
 * The stream: `GET /kv/events` on the worker's system server, server-sent events. It opens with a
 * `snapshot` (every block held now), then one `kv` event per batch. A subscriber that sees a gap
 * in `seq`, or a new `incarnation` (the engine restarted, possibly under the same worker id),
 * drops what it knew of the worker and reconnects for a fresh snapshot.
 */
export type KvEvent =
  | { type: 'stored'; block_hashes: BlockHash[]; parent_block_hash: BlockHash }
  | { type: 'removed'; block_hashes: BlockHash[] }
  | { type: 'cleared' };

export interface KvSnapshot {
  worker_id: string;
  /** Random per engine start: entries of an older incarnation are stale. */
  incarnation: string;
  /** The seq of the last batch included in `blocks`; the next batch has seq + 1. */
  seq: number;
  block_size: number;
  blocks: BlockHash[];
  /** How many blocks the engine's cache holds at most, where it says (routers weigh what a new prompt would evict). */
  capacity_blocks?: number | undefined;
}

export interface KvEventBatch {
  worker_id: string;
  incarnation: string;
  /** Consecutive from the snapshot's seq + 1. */
  seq: number;
  /** Milliseconds since the epoch, when the engine made the batch. */
  ts: number;
  events: KvEvent[];
}

/**
 * How the frontend turns a request's prompt into the token ids the worker's hashes cover:
 * `mocker-words` it does itself (protocol/mocker-tokenizer.ts); `worker` asks a worker of the
 * model (`POST /tokenize` on its request plane). Where a worker declares no kv_cache, the frontend
 * indexes what it sent (approximate mode).
 */
export type TokenizerKind = 'mocker-words' | 'worker';

/** A worker's prefix cache as its discovery record declares it. */
export interface KvCacheDeclaration {
  block_size: number;
  tokenizer: TokenizerKind;
  /** `exact`: the worker publishes /kv/events; `none`: the frontend approximates from what it sent. */
  events: 'exact' | 'none';
}

/**
 * What the frontends routing to a worker have sent it and the worker has not yet prefilled, with
 * the load they add: the part of a kv router's choice that the KV events cannot say yet (a prompt is
 * stored only once prefilled). A frontend names itself and its prediction of a request's uncached
 * prompt tokens on each /generate (ROUTED_BY_HEADER, PREFILL_TOKENS_HEADER); the worker sums them
 * per frontend and sends `load` events on its KV event stream, coalesced, while two or more
 * frontends follow it. Each frontend adds the other frontends' entries to its own counts, so eight
 * frontends weigh a worker's queue as one would.
 */
export interface KvLoad {
  worker_id: string;
  /** Per frontend: its requests in flight here, and the uncached prompt tokens of each one not yet prefilled. */
  frontends: Record<string, [inflight: number, prefill: number[]]>;
}

/** The frontend that routed a /generate (its id, stable while it runs). */
export const ROUTED_BY_HEADER = 'x-ebb-routed-by';
/** Its prediction of the request's prompt tokens this worker has not cached (what it must prefill). */
export const PREFILL_TOKENS_HEADER = 'x-ebb-prefill-tokens';
