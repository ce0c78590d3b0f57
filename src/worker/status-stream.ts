import type { FastifyInstance } from 'fastify';
import { allowOnly } from '../common/http-server.js';
import { SseHub, sseFrame } from '../common/sse-hub.js';
import type { WorkerRuntime } from './phase.js';

/** In-flight changes under load come by the hundred a second: at most one status event per this. */
export const STATUS_COALESCE_MS = 200;
/** Audit events sent in a stream's opening `history` (GET /engine/events has the rest). */
export const HISTORY_AUDIT_EVENTS = 50;

/**
 * GET /engine/status/events: the worker's status pushed as server-sent events, so a dashboard or a
 * frontend follows it without polling. The stream opens with the current status; then `status` on
 * every lifecycle transition (at once) and on in-flight or wait changes (coalesced), and `audit`
 * for every audit event (GET /engine/events holds the recent ones). Right after the first status
 * comes `history` ({inflight: [[age_ms, n]...] over the last minute, audit: the last
 * HISTORY_AUDIT_EVENTS events}), so a dashboard opened now shows the minute before it. Read-only,
 * like /engine/status.
 */
export function addStatusStream(app: FastifyInstance, runtime: () => WorkerRuntime, statusBody: (r: WorkerRuntime) => unknown): void {
  const hub = new SseHub(app);
  let attached: WorkerRuntime | undefined;
  let pending: NodeJS.Timeout | undefined;

  const push = (r: WorkerRuntime) => {
    clearTimeout(pending);
    pending = undefined;
    hub.send('status', statusBody(r));
  };
  // A timer is right here: it bounds the event rate, it does not stand in for an event.
  const coalesced = (r: WorkerRuntime) => {
    if (hub.size > 0) pending ??= setTimeout(() => push(r), STATUS_COALESCE_MS);
  };
  const attach = (r: WorkerRuntime) => {
    if (attached === r) return;
    attached = r;
    r.lifecycle.on('transition', () => push(r));
    r.lifecycle.on('inflight', () => coalesced(r));
    r.lifecycle.on('waiting', () => coalesced(r));
    r.lifecycle.audit.on('event', (e) => hub.send('audit', e));
  };
  app.addHook('preClose', async () => clearTimeout(pending));

  allowOnly(app, '/engine/status/events', ['GET']);
  app.get('/engine/status/events', async (_req, reply) => {
    const r = runtime();
    attach(r);
    const history = { inflight: r.lifecycle.inflightHistory.list(), audit: r.lifecycle.audit.list().slice(-HISTORY_AUDIT_EVENTS) };
    hub.open(reply, [sseFrame('status', statusBody(r)), sseFrame('history', history)]);
  });
}
