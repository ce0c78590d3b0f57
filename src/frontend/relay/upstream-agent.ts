import { Agent } from 'undici';
import { Gauge, type Registry } from 'prom-client';

/**
 * The keep-alive pool to workers. By default it opens as many connections per worker as there
 * are requests for it: a worker's own admission (its batch slots, its queue, worker_overloaded) is
 * the limit, and a frontend-side cap below it would make requests wait in the frontend, unseen by
 * the worker and by routing. `connections` caps it per worker when an operator wants that; requests
 * past the cap wait for a connection and are counted in ebb_frontend_upstream_waiting_requests.
 */
export function createUpstreamAgent(connections?: number | undefined): Agent {
  return new Agent({
    keepAliveTimeout: 30_000,
    keepAliveMaxTimeout: 60_000,
    connections: connections !== undefined && connections > 0 ? connections : null,
    pipelining: 1,
    headersTimeout: 0,
    bodyTimeout: 0,
  });
}

/** Requests queued in the pool for a free connection, over every worker origin. */
export function waitingRequests(agent: Agent): number {
  let n = 0;
  for (const s of Object.values(agent.stats)) n += (s as { queued?: number }).queued ?? 0;
  return n;
}

export const WAITING_METRIC = 'ebb_frontend_upstream_waiting_requests';

/** Exposes waitingRequests(agent) on `registry` (read at scrape time; nothing on the request path). */
export function registerWaitingGauge(registry: Registry, agent: Agent): void {
  if (registry.getSingleMetric(WAITING_METRIC)) registry.removeSingleMetric(WAITING_METRIC);
  new Gauge({
    name: WAITING_METRIC,
    help: 'Requests waiting inside the frontend for a connection to their worker (only with --upstream-connections)',
    registers: [registry],
    collect() {
      this.set(waitingRequests(agent));
    },
  });
}
