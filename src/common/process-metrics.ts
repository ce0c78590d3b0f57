import { collectDefaultMetrics, type Registry } from 'prom-client';

/** prom-client names these gauges *_total, which promtool (rightly) rejects: only counters end in _total. */
const MISNAMED = ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total'];

/**
 * The standard process and Node.js metrics (process_cpu_seconds_total, nodejs_eventloop_lag_*, ...)
 * under their usual names, so dashboards written for any Node service work; the job label says
 * which component. The misnamed totals are dropped: `nodejs_active_handles`, `nodejs_active_requests`
 * and `nodejs_active_resources{type}` say the same under valid names.
 */
export function collectProcessMetrics(registry: Registry): void {
  collectDefaultMetrics({ register: registry });
  for (const name of MISNAMED) registry.removeSingleMetric(name);
}
