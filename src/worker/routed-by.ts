import { EventEmitter } from 'node:events';
import type { Logger } from 'pino';
import { Backoff, pause } from '../common/backoff.js';
import type { RouteMarks } from '../discovery/route-marks.js';

/**
 * Whether the frontends route to this worker, as their marks in discovery say: `unknown` until the
 * marks were read once; `routed` when every live frontend marks it (with none live, there is no
 * frontend a rollout could leave without a worker: a fleet without frontends, or one whose
 * frontends predate the marks, rolls as before); `waiting` while some frontend does not mark it yet.
 */
export type Routing =
  | { readonly state: 'unknown' }
  | { readonly state: 'routed'; readonly frontends: readonly string[] }
  | { readonly state: 'waiting'; readonly frontends: readonly string[]; readonly routedBy: readonly string[] };

const RETRY = { minMs: 250, maxMs: 5000, jitter: true };

const key = (r: Routing): string => JSON.stringify(r);

/**
 * Follows the frontends' marks (a change told by discovery, then every mark read), and holds what
 * they say of this worker. One owner of the state, one setter; emits `change` when it changes. A
 * read that fails keeps the last answer and is retried.
 */
export class RoutedBy extends EventEmitter {
  private current: Routing = { state: 'unknown' };
  private readonly stop = new AbortController();
  private watch: { close(): Promise<void> } | undefined;
  private reading = false;
  private again = false;

  constructor(
    private readonly marks: RouteMarks,
    private readonly workerId: string,
    private readonly log: Logger,
  ) {
    super();
  }

  get routing(): Routing {
    return this.current;
  }

  async start(): Promise<void> {
    this.watch = await this.marks.watch(() => this.refresh());
    this.refresh();
  }

  async close(): Promise<void> {
    this.stop.abort();
    await this.watch?.close();
  }

  private set(next: Routing): void {
    if (key(next) === key(this.current)) return;
    const before = this.current;
    this.current = next;
    const counts = (r: Routing) => (r.state === 'unknown' ? '' : `${r.state === 'routed' ? r.frontends.length : r.routedBy.length}/${r.frontends.length}`);
    if (before.state !== next.state || counts(before) !== counts(next)) {
      const frontends = next.state === 'unknown' ? 0 : next.frontends.length;
      const routedBy = next.state === 'routed' ? frontends : next.state === 'waiting' ? next.routedBy.length : 0;
      this.log.info({ event: 'routing_changed', from: before.state, to: next.state, routed_by: routedBy, frontends }, `frontends routing to this worker: ${describeRouting(next)}`);
    }
    this.emit('change', next);
  }

  /** Reads every mark; one read at a time, and one more if a change came meanwhile. */
  private refresh(): void {
    this.again = true;
    if (this.reading) return;
    this.reading = true;
    void (async () => {
      const backoff = new Backoff(RETRY);
      let failing = false;
      while (this.again && !this.stop.signal.aborted) {
        this.again = false;
        try {
          const marks = await this.marks.list();
          const frontends = marks.map((m) => m.frontend_id).sort();
          const routedBy = marks.filter((m) => m.workers.includes(this.workerId)).map((m) => m.frontend_id).sort();
          this.set(routedBy.length === frontends.length ? { state: 'routed', frontends } : { state: 'waiting', frontends, routedBy });
          failing = false;
        } catch (err) {
          if (!failing) this.log.warn({ event: 'routing_unreadable', err: (err as Error).message }, `cannot read the frontends' marks (the last answer stands): ${(err as Error).message}`);
          failing = true;
          this.again = true;
          if (!(await pause(backoff.next(), this.stop.signal))) break;
        }
      }
      this.reading = false;
    })();
  }
}

export function describeRouting(r: Routing): string {
  if (r.state === 'unknown') return 'not read yet';
  if (r.state === 'routed') return r.frontends.length === 0 ? 'no frontend marks workers (none to wait for)' : `all ${r.frontends.length} frontend(s)`;
  return `${r.routedBy.length} of ${r.frontends.length} frontend(s) (waiting for ${r.frontends.filter((f) => !r.routedBy.includes(f)).join(', ')})`;
}
