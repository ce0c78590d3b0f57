import type { FastifyInstance } from 'fastify';
import { allowOnly } from '../common/http-server.js';
import { SseHub, sseFrame } from '../common/sse-hub.js';
import type { KvEventBatch, KvLoad, KvSnapshot } from '../protocol/kv-events.js';
import { EbbError } from '../protocol/errors.js';
import type { WorkerRuntime } from './phase.js';

/** The frontends of a fleet subscribe once each; more than this is a misbehaving client, not a fleet. */
export const KV_EVENT_SUBSCRIBERS_MAX = 64;
export const KV_EVENTS_PATH = '/kv/events';

/** Checks a read-only stream's caller: the admin token, where the worker has one (see admin-auth). */
export type ReadGuard = (authorization: string | undefined) => void;

/**
 * GET /kv/events: what the worker's engine stored in and evicted from its prefix cache, as
 * server-sent events (protocol/kv-events.ts): a `snapshot` first, then one `kv` event per batch
 * with consecutive seq. Read-only, but it needs the admin token where the worker has one. Bounded: a subscriber that does not keep up
 * is dropped by the hub (it reconnects for a fresh snapshot), and subscribers are capped. The log
 * is listened to only while someone subscribes, so an unwatched worker numbers no batches.
 * Beside them, `load` events (KvLoad): what each routing frontend has in flight here and not yet
 * prefilled, at most one per event-loop turn as the batches, while two or more frontends follow the
 * stream (one frontend alone has nothing to learn from it).
 */
export function addKvEventStream(app: FastifyInstance, workerId: string, runtime: () => WorkerRuntime, guard: ReadGuard): void {
  let unsubscribe: (() => void) | undefined;
  const hub = new SseHub(
    app,
    () => {
      unsubscribe?.();
      unsubscribe = undefined;
    },
    KV_EVENT_SUBSCRIBERS_MAX,
  );
  let loadDue = false;
  // Whether the last load event went to two or more frontends: when one is left, it is sent one more, so it keeps no stale count of the others.
  let sentShared = false;
  const sendLoad = () => {
    loadDue = false;
    const routed = runtime().routedLoad;
    const shared = hub.size >= 2;
    if (routed === undefined || (!shared && !sentShared)) return;
    sentShared = shared;
    hub.send('load', routed.snapshot(workerId) satisfies KvLoad);
  };

  allowOnly(app, KV_EVENTS_PATH, ['GET']);
  app.get(KV_EVENTS_PATH, async (req, reply) => {
    guard(req.headers.authorization);
    const log = runtime().engine.kvEvents;
    if (log === undefined) throw new EbbError('not_found', "this worker's engine publishes no KV events (it declares no kv_cache with exact events)");
    hub.assertRoom('KV event subscribers');
    // Snapshot before subscribing: it flushes pending events to the subscribers there are, and
    // everything after it arrives as batches from its seq + 1 on.
    const capacity = runtime().engine.kvCacheStats?.().capacity_blocks;
    const snapshot: KvSnapshot = { worker_id: workerId, ...log.snapshot(), ...(typeof capacity === 'number' && capacity > 0 && { capacity_blocks: capacity }) };
    const routed = runtime().routedLoad;
    if (unsubscribe === undefined) {
      const stopBatches = log.onBatch((b) => hub.send('kv', { worker_id: workerId, ...b } satisfies KvEventBatch));
      if (routed !== undefined)
        routed.onChange = () => {
          if (loadDue) return;
          loadDue = true;
          setImmediate(sendLoad);
        };
      unsubscribe = () => {
        stopBatches();
        if (routed !== undefined) routed.onChange = undefined;
        sentShared = false;
      };
    }
    // A frontend joining while others route here starts from their counts too.
    hub.open(reply, [sseFrame('snapshot', snapshot), ...(routed !== undefined && hub.size >= 1 ? [sseFrame('load', routed.snapshot(workerId) satisfies KvLoad)] : [])]);
  });
}
