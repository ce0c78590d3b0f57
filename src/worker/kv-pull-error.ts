import type { KvTransferRef } from '../protocol/request-plane.js';

/** The message names the transfer and its prefill worker, never what the far end answered. */
export class KvPullError extends Error {
  constructor(ref: KvTransferRef, what: string, readonly detail: string) {
    super(`KV transfer ${ref.transfer_id} from prefill worker ${ref.worker_id}: ${what}`);
  }
}
