import type { Discovery, DiscoveryEvent, DiscoveryWatch } from '../discovery/discovery.js';
import type { KvTransferRef } from '../protocol/request-plane.js';

/**
 * A prefill worker that left discovery (draining) still serves the KV it computed for requests it
 * admitted, so a decode worker keeps trusting its URL for a while after it left.
 */
export const DEPARTED_RETENTION_MS = 10 * 60_000;

/**
 * The prefill workers a decode worker may pull KV from: those it has seen registered in its own
 * discovery view, at the URL they registered. A kv_transfer naming anything else is refused, so a
 * request body cannot make a worker fetch (GET, then DELETE) an arbitrary URL.
 */
export class PrefillPeers {
  /** Every worker seen, with its mode: a hand-off's KV may come from any of them (trusts(ref, 'any')). */
  private readonly peers = new Map<string, { url: string; mode: string; leftAt?: number }>();
  private watch: DiscoveryWatch | undefined;

  async start(discovery: Discovery): Promise<void> {
    this.watch = await discovery.watch((e) => this.apply(e));
  }

  apply(event: DiscoveryEvent, now = Date.now()): void {
    if (event.type === 'reset') {
      const listed = new Set<string>();
      for (const r of event.records) listed.add(r.worker_id);
      for (const [id, p] of this.peers) if (!listed.has(id) && p.leftAt === undefined) p.leftAt = now;
      for (const r of event.records) this.peers.set(r.worker_id, { url: r.request_url, mode: r.mode });
    } else if (event.type === 'put') {
      this.peers.set(event.record.worker_id, { url: event.record.request_url, mode: event.record.mode });
    } else {
      const p = this.peers.get(event.worker_id);
      if (p && p.leftAt === undefined) p.leftAt = now;
    }
    for (const [id, p] of this.peers) if (p.leftAt !== undefined && now - p.leftAt > DEPARTED_RETENTION_MS) this.peers.delete(id);
  }

  /** True when `ref` names a prefill worker (or with 'any', any worker) seen in discovery, at the URL it registered. */
  trusts(ref: KvTransferRef, modes: 'prefill' | 'any' = 'prefill'): boolean {
    const p = this.peers.get(ref.worker_id);
    return p !== undefined && p.url === ref.source_url && (modes === 'any' || p.mode === 'prefill');
  }

  async close(): Promise<void> {
    await this.watch?.close();
  }
}
