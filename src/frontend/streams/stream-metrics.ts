import type { Logger } from 'pino';
import { Counter, Gauge, type Registry } from 'prom-client';
import type { StreamStoreMetrics } from './stream-store.js';

/** The stream store on /metrics: what it keeps, resumes by outcome, and the work wasted on streams nobody came back to. */
export function createStreamMetrics(registry: Registry, log: Logger): StreamStoreMetrics & { storeUp(up: boolean): void; takenOver(): void } {
  let store: { keptBytes: number; size: number } | undefined;
  new Gauge({
    name: 'ebb_frontend_streams_kept',
    help: 'Streams kept for resumption (live, and ended within the resume window)',
    registers: [registry],
    collect() {
      this.set(store?.size ?? 0);
    },
  });
  new Gauge({
    name: 'ebb_frontend_stream_store_bytes',
    help: 'Bytes of SSE events kept for resumption',
    registers: [registry],
    collect() {
      this.set(store?.keptBytes ?? 0);
    },
  });
  const resumes = new Counter({ name: 'ebb_frontend_stream_resumes_total', help: 'Stream resumes by outcome (resumed, not_found, expired)', labelNames: ['outcome'], registers: [registry] });
  const abandoned = new Counter({ name: 'ebb_frontend_streams_abandoned_total', help: 'Streams cancelled at the end of their grace: their client left and nobody resumed', registers: [registry] });
  const wasted = new Counter({
    name: 'ebb_frontend_abandoned_stream_events_total',
    help: 'Events (about one per token) generated for abandoned streams while nobody followed them: wasted work',
    registers: [registry],
  });
  const forgotten = new Counter({ name: 'ebb_frontend_streams_forgotten_total', help: 'Kept streams forgotten, by why (window, bytes, count)', labelNames: ['reason'], registers: [registry] });
  let responses: { keptBytes: number; size: number } | undefined;
  new Gauge({
    name: 'ebb_frontend_responses_kept',
    help: 'Responses API responses kept (live, and stored ones within --response-ttl-ms)',
    registers: [registry],
    collect() {
      this.set(responses?.size ?? 0);
    },
  });
  new Gauge({
    name: 'ebb_frontend_response_store_bytes',
    help: "Bytes of the kept responses' conversations and objects",
    registers: [registry],
    collect() {
      this.set(responses?.keptBytes ?? 0);
    },
  });
  const takeovers = new Counter({
    name: 'ebb_frontend_stream_takeovers_total',
    help: 'Kept streams this frontend continued for a frontend that was gone (killed, or handed them on at its shutdown): their generation goes on here',
    registers: [registry],
  });
  const up = new Gauge({ name: 'ebb_frontend_stream_store_up', help: 'Whether the shared stream store (Redis) can be reached (1 without one)', registers: [registry], aggregator: 'min' });
  up.set(1);
  for (const outcome of ['resumed', 'not_found', 'expired']) resumes.inc({ outcome }, 0);
  for (const reason of ['window', 'bytes', 'count']) forgotten.inc({ reason }, 0);
  return {
    watch(s) {
      store = s;
    },
    watchResponses(r) {
      responses = r;
    },
    abandoned(id, events) {
      abandoned.inc();
      wasted.inc(events);
      log.info({ event: 'stream_abandoned', response_id: id, unfollowed_events: events }, `stream ${id} cancelled: its client left and nobody resumed it within the grace`);
    },
    forgotten(reason) {
      forgotten.inc({ reason });
    },
    resume(outcome) {
      resumes.inc({ outcome });
    },
    storeUp(ok) {
      up.set(ok ? 1 : 0);
    },
    takenOver() {
      takeovers.inc();
    },
  };
}
