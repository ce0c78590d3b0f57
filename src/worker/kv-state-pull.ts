import { Agent, request } from 'undici';
import { bearerHeader } from '../common/admin-auth.js';
import type { Engine, KvStateHandle } from '../engine/engine.js';
import type { KvTransferRef } from '../protocol/request-plane.js';
import { KV_STATE_HEADER, KvStatePullError } from './kv-state-wire.js';
import type { TracedHeaders } from './kv-pull.js';

const agent = new Agent({ keepAliveTimeout: 30_000, connections: 64 });

const url = (ref: KvTransferRef) => `${ref.source_url}/kv/${encodeURIComponent(ref.transfer_id)}`;

/** Confirms receipt so the source frees the state (and, draining, may reach drained); never throws. */
export async function releaseKvState(ref: KvTransferRef, token?: string): Promise<void> {
  try {
    const ack = await request(url(ref), { method: 'DELETE', dispatcher: agent, headers: bearerHeader(token), signal: AbortSignal.timeout(5000) });
    await ack.body.dump();
  } catch {
    /* unreachable: the state expires there on its own */
  }
}

/**
 * Pulls a real KV state (a prefill's, or a hand-off's) into `engine`, which checks it (model,
 * context, size bound, hash) while it is received. Whatever happens, the source is told to free
 * it: a refused state would otherwise hold the source's drain until its TTL. The caller has checked
 * that `ref` names a worker registered in its discovery view.
 */
export async function pullKvState(
  ref: KvTransferRef,
  engine: Required<Pick<Engine, 'importKv'>>,
  signal: AbortSignal,
  token?: string,
  trace?: TracedHeaders,
): Promise<KvStateHandle> {
  let res;
  try {
    res = await request(url(ref), { method: 'GET', dispatcher: agent, signal, headers: trace === undefined ? bearerHeader(token) : trace.headers(bearerHeader(token)) });
  } catch (err) {
    if (signal.aborted) {
      // The caller left before the source answered: nobody will pull it now.
      void releaseKvState(ref, token);
      throw err;
    }
    throw new KvStatePullError('unavailable', ref, `unreachable (${(err as Error).message})`);
  }
  if (res.statusCode !== 200) {
    await res.body.dump();
    throw new KvStatePullError('unavailable', ref, `unavailable (completed, expired or never made): HTTP ${res.statusCode}`);
  }
  try {
    const header = res.headers[KV_STATE_HEADER];
    if (typeof header !== 'string') throw new KvStatePullError('refused', ref, 'the source sent no state header (an engine without real KV state)');
    const bytes = Number(res.headers['content-length']);
    if (!Number.isSafeInteger(bytes)) throw new KvStatePullError('refused', ref, 'the source did not say the state size');
    try {
      return await engine.importKv(header, bytes, res.body, signal);
    } catch (err) {
      if (signal.aborted) throw err;
      throw new KvStatePullError('refused', ref, (err as Error).message);
    }
  } finally {
    // What was not read (a refused state) is dropped; destroy() would emit an unhandled error.
    await res.body.dump().catch(() => undefined);
    await releaseKvState(ref, token);
  }
}
