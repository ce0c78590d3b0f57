import { Agent, request } from 'undici';
import { bearerHeader } from '../common/admin-auth.js';
import type { KvTransferRef } from '../protocol/request-plane.js';
import { KvPullError } from './kv-pull-error.js';

const agent = new Agent({ keepAliveTimeout: 30_000, connections: 64 });

export { KvPullError } from './kv-pull-error.js';

/**
 * Decode side: fetch the prompt's KV from the prefill worker, then confirm receipt so the prefill
 * worker can free it (and, if draining, reach drained). Returns the bytes received. The caller has
 * checked that `ref` names a registered prefill worker.
 */
export async function pullKv(ref: KvTransferRef, signal: AbortSignal, token?: string): Promise<number> {
  const url = `${ref.source_url}/kv/${encodeURIComponent(ref.transfer_id)}`;
  const headers = bearerHeader(token);
  const res = await request(url, { method: 'GET', dispatcher: agent, signal, headers });
  if (res.statusCode !== 200) {
    await res.body.dump();
    throw new KvPullError(ref, 'unavailable (completed, expired or never made)', `HTTP ${res.statusCode}`);
  }
  const expected = Number(res.headers['content-length']);
  let received = 0;
  for await (const chunk of res.body) received += (chunk as Buffer).length;
  if (Number.isFinite(expected) && received !== expected) throw new KvPullError(ref, 'truncated', `${received}/${expected} bytes`);
  const ack = await request(url, { method: 'DELETE', dispatcher: agent, signal, headers });
  await ack.body.dump();
  if (ack.statusCode !== 204) throw new KvPullError(ref, 'receipt not confirmed', `HTTP ${ack.statusCode}`);
  return received;
}
