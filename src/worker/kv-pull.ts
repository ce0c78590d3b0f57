import { Agent, request } from 'undici';
import { bearerHeader } from '../common/admin-auth.js';
import { countBounded } from '../common/bounded-read.js';
import type { KvTransferRef } from '../protocol/request-plane.js';
import { KvPullError } from './kv-pull-error.js';

const agent = new Agent({ keepAliveTimeout: 30_000, connections: 64 });
/** A simulated KV payload is its kv_bytes of filler: far below this. */
const MAX_KV_BYTES = 1 << 30;

export { KvPullError } from './kv-pull-error.js';

/** With tracing on: adds the pull's traceparent to its headers (the source's span joins the puller's trace). */
export interface TracedHeaders {
  headers(base: Record<string, string>): Record<string, string>;
}

/** How long freeing a transfer whose pull did not finish may take; it expires at its source anyway. */
const RELEASE_TIMEOUT_MS = 5000;

/**
 * Decode side: fetch the prompt's KV from the prefill worker, then confirm receipt so the prefill
 * worker can free it (and, if draining, reach drained). Returns the bytes received. A pull that does
 * not finish (its caller left, the payload came short) frees the transfer at its source all the same,
 * without holding the request up: nobody will pull it again. The caller has checked that `ref`
 * names a registered prefill worker.
 */
export async function pullKv(ref: KvTransferRef, signal: AbortSignal, token?: string, trace?: TracedHeaders): Promise<number> {
  const url = `${ref.source_url}/kv/${encodeURIComponent(ref.transfer_id)}`;
  const headers = trace === undefined ? bearerHeader(token) : trace.headers(bearerHeader(token));
  let confirmed = false;
  try {
    const res = await request(url, { method: 'GET', dispatcher: agent, signal, headers });
    if (res.statusCode !== 200) {
      await res.body.dump();
      throw new KvPullError(ref, 'unavailable (completed, expired or never made)', `HTTP ${res.statusCode}`);
    }
    const expected = Number(res.headers['content-length']);
    // No more than the source said it would send (a source that did not say: a mocker payload's bound).
    const received = await countBounded(res.body, Number.isFinite(expected) ? expected : MAX_KV_BYTES, 'KV payload');
    if (Number.isFinite(expected) && received !== expected) throw new KvPullError(ref, 'truncated', `${received}/${expected} bytes`);
    const ack = await request(url, { method: 'DELETE', dispatcher: agent, signal, headers });
    await ack.body.dump();
    confirmed = ack.statusCode === 204;
    if (!confirmed) throw new KvPullError(ref, 'receipt not confirmed', `HTTP ${ack.statusCode}`);
    return received;
  } finally {
    if (!confirmed) void release(url, headers);
  }
}

/** DELETE /kv/{id} at the source; never throws (an unreachable source expires it on its own). */
async function release(url: string, headers: Record<string, string>): Promise<void> {
  try {
    const res = await request(url, { method: 'DELETE', dispatcher: agent, headers, signal: AbortSignal.timeout(RELEASE_TIMEOUT_MS) });
    await res.body.dump();
  } catch {
    /* expires at its source */
  }
}
