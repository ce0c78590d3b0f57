import type { FastifyInstance } from 'fastify';
import { allowOnly } from '../common/http-server.js';
import { SseHub, sseFrame } from '../common/sse-hub.js';
import type { WorkerRuntime } from './phase.js';
import type { ReadGuard } from './kv-event-stream.js';

/** In-flight changes under load come by the hundred a second: at most one status event per this. */
export const STATUS_COALESCE_MS = 200;
/** Audit events sent in a stream's opening `history` (GET /engine/events has the rest). */
export const HISTORY_AUDIT_EVENTS = 50;
/** Each frontend (its admin listener, while a dashboard is open) and a few operators' tools follow a worker. */
export const STATUS_STREAM_SUBSCRIBERS_MAX = 64;
export const STATUS_EVENTS_PATH = '/engine/status/events';

/**
 * GET /engine/status/events: the worker's status pushed as server-sent events, so a dashboard or a
 * frontend follows it without polling. The stream opens with the current status; then `status` on
 * every lifecycle transition (at once) and on in-flight or wait changes (coalesced), and `audit`
 * for every audit event (GET /engine/events holds the recent ones). Right after the first status
 * comes `history` ({inflight: [[age_ms, n]...] over the last minute, audit: the last
 * HISTORY_AUDIT_EVENTS events}), so a dashboard opened now shows the minute before it. Read-only,
 * but it needs the admin token where the worker has one.
 */
export function addStatusStream(app: FastifyInstance, runtime: () => WorkerRuntime, statusBody: (r: WorkerRuntime) => unknown, guard: ReadGuard): void {
  const hub = new SseHub(app, undefined, STATUS_STREAM_SUBSCRIBERS_MAX);
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
    r.adapters?.on('change', () => push(r));
    r.routedBy?.on('change', () => push(r));
    r.adapters?.on('inflight', () => coalesced(r));
    r.lifecycle.audit.on('event', (e) => hub.send('audit', e));
  };
  app.addHook('preClose', async () => clearTimeout(pending));

  allowOnly(app, STATUS_EVENTS_PATH, ['GET']);
  app.get(STATUS_EVENTS_PATH, async (req, reply) => {
    guard(req.headers.authorization);
    const r = runtime();
    hub.assertRoom('status event streams');
    attach(r);
    const history = { inflight: r.lifecycle.inflightHistory.list(), audit: r.lifecycle.audit.list().slice(-HISTORY_AUDIT_EVENTS) };
    hub.open(reply, [sseFrame('status', statusBody(r)), sseFrame('history', history)]);
  });
}
