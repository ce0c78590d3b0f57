import { Agent, request } from 'undici';
import type { KvTransferRef } from '../protocol/request-plane.js';

const agent = new Agent({ keepAliveTimeout: 30_000, connections: 64 });

export class KvPullError extends Error {}

/**
 * Decode side: fetch the prompt's KV from the prefill worker, then confirm receipt so the prefill
 * worker can free it (and, if draining, reach drained). Returns the bytes received.
 */
export async function pullKv(ref: KvTransferRef, signal: AbortSignal): Promise<number> {
  const url = `${ref.source_url}/kv/${encodeURIComponent(ref.transfer_id)}`;
  const res = await request(url, { method: 'GET', dispatcher: agent, signal });
  if (res.statusCode !== 200) {
    await res.body.dump();
    throw new KvPullError(`KV transfer ${ref.transfer_id} unavailable at ${ref.source_url} (HTTP ${res.statusCode})`);
  }
  const expected = Number(res.headers['content-length']);
  let received = 0;
  for await (const chunk of res.body) received += (chunk as Buffer).length;
  if (Number.isFinite(expected) && received !== expected) throw new KvPullError(`KV transfer ${ref.transfer_id} truncated: ${received}/${expected} bytes`);
  const ack = await request(url, { method: 'DELETE', dispatcher: agent, signal });
  await ack.body.dump();
  if (ack.statusCode !== 204) throw new KvPullError(`KV transfer ${ref.transfer_id} receipt not confirmed (HTTP ${ack.statusCode})`);
  return received;
}
