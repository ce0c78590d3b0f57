import { EventEmitter } from 'node:events';
import { randomBytes } from 'node:crypto';

/** Simulated KV cache size per prompt token (bytes); real engines report their own. */
export const KV_BYTES_PER_TOKEN = 1024;

export interface KvTransfer {
  transfer_id: string;
  prompt_tokens: number;
  kv_bytes: number;
  created_at: number;
  /** Prompt tokens the prefill found in its prefix cache (PrefillResponse.cached_tokens). */
  cached_tokens?: number;
}

/**
 * KV caches a prefill worker computed and holds for a decode peer. A transfer is pending from the
 * moment prefill finishes until the decode side confirms receipt (`complete`) or its TTL expires.
 * Freeing the worker while one is pending would crash the peer still pulling it.
 *
 * Events: 'completed' (transfer, seconds), 'expired' (transfer).
 */
export class KvTransferStore extends EventEmitter {
  private readonly pending = new Map<string, { transfer: KvTransfer; timer: NodeJS.Timeout }>();

  constructor(readonly ttlMs: number) {
    super();
  }

  get size(): number {
    return this.pending.size;
  }

  /** `kvBytes`: the real size where the engine has one (simulated from the tokens otherwise). */
  create(promptTokens: number, kvBytes = promptTokens * KV_BYTES_PER_TOKEN): KvTransfer {
    const transfer: KvTransfer = {
      transfer_id: `kv-${randomBytes(8).toString('hex')}`,
      prompt_tokens: promptTokens,
      kv_bytes: kvBytes,
      created_at: performance.now(),
    };
    // The TTL is the contract with the decode side, not a stand-in for an event.
    const timer = setTimeout(() => this.end(transfer.transfer_id, 'expired'), this.ttlMs);
    timer.unref();
    this.pending.set(transfer.transfer_id, { transfer, timer });
    return transfer;
  }

  get(id: string): KvTransfer | undefined {
    return this.pending.get(id)?.transfer;
  }

  /** The decode side confirmed receipt. False if the transfer is unknown (already completed or expired). */
  complete(id: string): boolean {
    return this.end(id, 'completed');
  }

  private end(id: string, how: 'completed' | 'expired'): boolean {
    const entry = this.pending.get(id);
    if (!entry) return false;
    clearTimeout(entry.timer);
    this.pending.delete(id);
    this.emit(how, entry.transfer, (performance.now() - entry.transfer.created_at) / 1000);
    return true;
  }

  close(): void {
    for (const { timer } of this.pending.values()) clearTimeout(timer);
  }
}
