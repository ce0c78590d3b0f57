import type { ServerResponse } from 'node:http';
import { Agent, request } from 'undici';
import { discardBody } from '../../common/discard-body.js';

/** Hop-by-hop headers: each connection's own, never passed on (RFC 9110 7.6.1). */
const HOP = new Set(['connection', 'keep-alive', 'transfer-encoding', 'upgrade', 'proxy-connection', 'te', 'trailer', 'host', 'content-length']);

const agent = new Agent({ keepAliveTimeout: 10_000 });

/**
 * A request for another process's kept stream or response (`ebb frontend --processes N`: the id
 * names the process that holds it), passed to that process's loopback listener and its answer
 * relayed as it comes: a resumed stream flows through, a client that leaves closes it there.
 */
export async function toPeer(peerUrl: string, method: string, url: string, headers: Record<string, string | string[] | undefined>, body: unknown, res: ServerResponse): Promise<void> {
  const sent: Record<string, string> = {};
  for (const [k, v] of Object.entries(headers)) if (!HOP.has(k) && typeof v === 'string') sent[k] = v;
  const controller = new AbortController();
  res.once('close', () => controller.abort());
  const answer = await request(`${peerUrl}${url}`, {
    method: method as 'GET' | 'POST',
    headers: body === undefined ? sent : { ...sent, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
    dispatcher: agent,
    signal: controller.signal,
  });
  // The answer names the process the client reached (its x-ebb-frontend-process, set already), not the holder.
  const out: Record<string, string | string[]> = {};
  for (const [k, v] of Object.entries(answer.headers)) if (!HOP.has(k) && k !== 'x-ebb-frontend-process' && v !== undefined) out[k] = v;
  res.writeHead(answer.statusCode, out);
  try {
    for await (const chunk of answer.body) if (!res.write(chunk)) await new Promise((resolve) => res.once('drain', resolve));
    res.end();
  } catch {
    res.destroy();
  } finally {
    discardBody(answer.body);
  }
}
