import type { KvTransferRef } from '../protocol/request-plane.js';

/**
 * What the request plane needs of a KV state pull without the pull itself: the pull brings undici,
 * which only a worker that moves KV states loads (on its first pull).
 */

/** The header a KV state's checks travel in, ahead of its bytes (see engine/llama-cpp-kv-state). */
export const KV_STATE_HEADER = 'x-ebb-kv-state';

/** How a pull ended: loaded (handed to the engine), refused (checked and rejected), unavailable (gone or unreachable). */
export type KvPullOutcome = 'pulled' | 'refused' | 'unavailable';

export class KvStatePullError extends Error {
  constructor(
    readonly outcome: Exclude<KvPullOutcome, 'pulled'>,
    ref: KvTransferRef,
    what: string,
  ) {
    super(`KV state ${ref.transfer_id} from worker ${ref.worker_id}: ${what}`);
  }
}
