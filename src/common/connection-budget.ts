import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { errorBody } from '../protocol/errors.js';

/**
 * A listener's connection budget that a flood of slow or idle connections cannot use to lock the
 * listener out. Node's own `maxConnections` closes every connection past the budget at accept, so
 * 100 slowloris connections (headers dripped a byte at a time) took every probe of an admin
 * listener to ECONNRESET until the header timeout freed them, and a failing liveness probe gets the
 * pod restarted. Instead, a connection past the budget:
 *
 * 1. evicts the oldest connection that holds nothing: idle between requests first, then one whose
 *    request has not fully arrived (a slowloris is exactly that), so a client that sends a request
 *    gets served and an attacker only ever displaces its own sockets;
 * 2. when every connection is busy with a request (long event streams, say), it is still taken, as
 *    one of PROBE_RESERVE extra connections that may only ask for a probe (answered, then closed);
 *    anything else there gets 503 `listener_busy`. A listener without probes (a worker's request
 *    plane) closes it, as Node would.
 *
 * Event streams (a frontend's KV subscription, a dashboard's status stream) are long requests that
 * would otherwise count as busy connections: 64 of them took every connection of a worker's system
 * port, and drain, resume and status answered 503 `listener_busy`. A listener that serves streams
 * gives them a budget of their own (`streams`): a connection carrying one leaves the main budget for
 * as long as it does, and a stream past its budget is refused, so streams never take the room of the
 * calls that change or read the worker's state.
 *
 * The socket count stays bounded (budget + streams + reserve): past that the kernel-level refusal is Node's.
 */

/** Connections past the budget kept for probes when no connection can be evicted. */
export const PROBE_RESERVE = 8;

interface Tracked {
  /** The request in progress on it, if any. */
  req?: IncomingMessage | undefined;
  /** Taken from the probe reserve: serves one probe, then closes. */
  probeOnly: boolean;
  /** Carries an event stream now: counted in the streams' budget, not the main one. */
  stream: boolean;
}

/** Long-lived GETs (server-sent event streams) with a connection budget of their own. */
export interface StreamBudget {
  paths: readonly string[];
  max: number;
}

/** What a probe is: a GET/HEAD of one of these paths. */
const isProbe = (req: IncomingMessage, probes: readonly string[]): boolean =>
  (req.method === 'GET' || req.method === 'HEAD') && probes.includes((req.url ?? '').split('?', 1)[0] as string);

function refuse(res: ServerResponse, message: string): void {
  const body = JSON.stringify(errorBody('listener_busy', message));
  res.writeHead(503, { 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(body), connection: 'close' }); // no Retry-After: when a connection frees is not known
  res.end(body);
}

/**
 * Puts `server` under the budget. Call once the request handler is attached (fastify attaches its
 * own at creation): it is wrapped, so a probe-only connection's other requests never reach it.
 */
export function applyConnectionBudget(server: Server, budget: number, probes: readonly string[], streams?: StreamBudget): void {
  // Insertion order is accept order: the first evictable one found is the oldest.
  const open = new Map<Socket, Tracked>();
  let streaming = 0;
  // One past the budget at least: Node refuses at accept, before a connection could make room.
  server.maxConnections = budget + (streams?.max ?? 0) + (probes.length > 0 ? PROBE_RESERVE : 1);

  const evictable = (pred: (t: Tracked) => boolean, except: Socket): Socket | undefined => {
    for (const [socket, t] of open) if (socket !== except && pred(t)) return socket;
    return undefined;
  };

  server.on('connection', (socket: Socket) => {
    const tracked: Tracked = { probeOnly: false, stream: false };
    open.set(socket, tracked);
    socket.once('close', () => open.delete(socket));
    if (open.size - streaming <= budget) return;
    const victim = evictable((t) => t.req === undefined, socket) ?? evictable((t) => t.req?.complete === false, socket);
    if (victim !== undefined) {
      open.delete(victim);
      victim.destroy();
    } else if (probes.length > 0) tracked.probeOnly = true;
    else socket.destroy(); // nothing to answer on it (a request plane has no probes)
  });

  const handlers = server.listeners('request') as Array<(req: IncomingMessage, res: ServerResponse) => void>;
  server.removeAllListeners('request');
  server.on('request', (req: IncomingMessage, res: ServerResponse) => {
    const tracked = open.get(req.socket);
    if (tracked !== undefined) {
      tracked.req = req;
      res.once('finish', () => {
        if (tracked.req === req) tracked.req = undefined;
      });
    }
    if (tracked !== undefined && streams !== undefined && isProbe(req, streams.paths)) {
      if (streaming >= streams.max) return refuse(res, `this listener serves at most ${streams.max} event streams at once; retry shortly`);
      // Out of the main budget while the stream lasts (a reserve connection too: it is a stream now).
      tracked.probeOnly = false;
      tracked.stream = true;
      streaming++;
      res.once('close', () => {
        tracked.stream = false;
        streaming--;
      });
    } else if (tracked?.probeOnly) {
      // One request, then the reserve slot is free again.
      res.shouldKeepAlive = false;
      if (!isProbe(req, probes)) return refuse(res, `every connection of this listener is busy (${budget}); only ${probes.join(', ') || 'no'} probes are answered now, retry shortly`);
    }
    for (const h of handlers) h.call(server, req, res);
  });
}
