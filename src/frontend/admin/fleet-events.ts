import type { FastifyInstance } from 'fastify';
import { Agent, request } from 'undici';
import { Backoff, pause } from '../../common/backoff.js';
import { allowOnly } from '../../common/http-server.js';
import { readSse, SseHub, sseFrame } from '../../common/sse-hub.js';
import { failureReason, identityMismatch, WORKER_ANSWER_LIMIT } from '../../common/worker-admin.js';
import type { WorkerRecord } from '../../discovery/discovery.js';
import type { FleetView } from './fleet-view.js';

/** Reconnect back-off for a worker's status stream that ended or failed. */
const RESUBSCRIBE = { minMs: 500, maxMs: 5000, jitter: true };
/** Bound on a worker's answer to the stream request (headers); the stream itself then lasts. */
const CONNECT_TIMEOUT_MS = 2000;

/**
 * GET /workers/events on the frontend's admin listener: the fleet as server-sent events. A client
 * first gets `snapshot` ({workers}: what GET /workers answers), then:
 *   worker_joined {worker}           a worker entered discovery (or came back to it)
 *   worker_left {worker_id, at}      it left discovery; still shown, as a drained worker must be
 *   worker_forgotten {worker_id}     it is gone (its system server no longer answers)
 *   status {worker_id, status, kv}   a worker's own status event (its lifecycle, in-flight, ETA), with the router's view of its cache
 *   audit {worker_id, event}         a worker's audit event (drain, resume, shutdown, hand-off)
 *   worker_unreachable {worker_id, error}   its status stream failed; retried with back-off
 * The frontend subscribes to each worker's /engine/status/events only while some client listens,
 * so an idle frontend holds no connection to any worker's admin port.
 */
export class FleetEvents {
  private readonly hub: SseHub;
  private readonly subs = new Map<string, Subscription>();
  private readonly agent = new Agent({ connect: { timeout: CONNECT_TIMEOUT_MS }, headersTimeout: CONNECT_TIMEOUT_MS, bodyTimeout: 0 });

  constructor(
    app: FastifyInstance,
    private readonly fleet: FleetView,
    snapshot: () => Promise<unknown[]>,
    /** The router's view of a worker's prefix cache (as in GET /workers' `kv`). */
    private readonly kv: (workerId: string) => unknown = () => null,
  ) {
    this.hub = new SseHub(app, () => this.unsubscribeAll());
    app.addHook('onClose', async () => {
      this.unsubscribeAll();
      await this.agent.close().catch(() => undefined);
    });
    fleet.on('joined', (record: WorkerRecord) => {
      this.hub.send('worker_joined', { worker: record });
      if (this.hub.size > 0) this.subscribe(record);
    });
    fleet.on('left', (id: string, at: number) => this.hub.send('worker_left', { worker_id: id, at: new Date(at).toISOString() }));
    fleet.on('forgotten', (id: string) => {
      this.subs.get(id)?.close();
      this.subs.delete(id);
      this.hub.send('worker_forgotten', { worker_id: id });
    });

    allowOnly(app, '/workers/events', ['GET']);
    app.get('/workers/events', async (_req, reply) => {
      const workers = await snapshot();
      this.hub.open(reply, [sseFrame('snapshot', { workers })]);
      for (const k of this.fleet.all()) this.subscribe(k.record);
    });
  }

  private subscribe(record: WorkerRecord): void {
    const current = this.subs.get(record.worker_id);
    if (current && current.url === record.system_url) return;
    current?.close();
    const sub = new Subscription(record, this.agent, (event, data) => this.onWorkerEvent(record.worker_id, sub, event, data));
    this.subs.set(record.worker_id, sub);
  }

  private onWorkerEvent(id: string, sub: Subscription, event: string, data: unknown): void {
    if (this.subs.get(id) !== sub) return;
    if (event === 'status') this.hub.send('status', { worker_id: id, status: data, kv: this.kv(id) });
    else if (event === 'audit') this.hub.send('audit', { worker_id: id, event: data });
    else if (event === 'error') {
      const error = String(data);
      this.hub.send('worker_unreachable', { worker_id: id, error });
      // A departed worker that stopped answering is gone: the fleet view forgets it (and says so).
      this.fleet.forgetIfGone(id, { reachable: false, error });
    } else if (event === 'connected') this.fleet.forgetIfGone(id, { reachable: true, status: data as never });
  }

  private unsubscribeAll(): void {
    for (const s of this.subs.values()) s.close();
    this.subs.clear();
  }
}

/**
 * One worker's status stream, reconnected with back-off until closed. Reports `status` and `audit`
 * events as they come, `connected` (with the first status) once the worker proved its identity, and
 * `error` (a reason) when the stream fails.
 */
class Subscription {
  readonly url: string;
  private readonly abort = new AbortController();
  private readonly backoff = new Backoff(RESUBSCRIBE);

  constructor(
    private readonly record: WorkerRecord,
    private readonly agent: Agent,
    private readonly emit: (event: string, data: unknown) => void,
  ) {
    this.url = record.system_url;
    void this.run();
  }

  close(): void {
    this.abort.abort();
  }

  private async run(): Promise<void> {
    while (!this.abort.signal.aborted) {
      try {
        await this.readOnce();
        if (this.abort.signal.aborted) return;
        this.emit('error', 'status stream ended');
      } catch (err) {
        if (this.abort.signal.aborted) return;
        this.emit('error', err instanceof Error && err.name === 'IdentityError' ? err.message : failureReason(err, CONNECT_TIMEOUT_MS));
      }
      await pause(this.backoff.next(), this.abort.signal);
    }
  }

  private async readOnce(): Promise<void> {
    const res = await request(`${this.url}/engine/status/events`, { dispatcher: this.agent, signal: this.abort.signal });
    if (res.statusCode !== 200) {
      res.body.destroy();
      throw new Error(`HTTP ${res.statusCode}`);
    }
    let first = true;
    // Bounded per event: the URL is discovery's, and whoever answers it has proved nothing yet.
    for await (const parsed of readSse(res.body, WORKER_ANSWER_LIMIT)) {
      if (first) {
        // A system port can be reused by another worker: whoever answers must be the one asked for.
        // Nothing is passed on before that: the first event must be its status.
        const answered = parsed.event === 'status' ? (parsed.data as { worker_id?: unknown } | null)?.worker_id : undefined;
        if (answered !== this.record.worker_id) {
          res.body.destroy();
          const e = new Error(identityMismatch(this.url, answered, this.record.worker_id));
          e.name = 'IdentityError';
          throw e;
        }
        first = false;
        this.backoff.reset();
        this.emit('connected', parsed.data);
      }
      this.emit(parsed.event, parsed.data);
    }
  }
}
