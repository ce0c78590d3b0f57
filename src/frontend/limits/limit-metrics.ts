import { Counter, Gauge, type Registry } from 'prom-client';
import type { LimitName } from './tenant-limits.js';

/** Tenants named in the limits' labels at most; the rest are counted as `other` (a file can name thousands). */
export const MAX_TENANT_LABELS = 50;

/** A tenant's budgets as last read (each reservation reads them): the remaining-budget gauge's source. */
export interface BudgetView {
  budgets(): Iterable<[tenant: string, period: 'day' | 'month', remaining: number]>;
}

/**
 * Tenants' limits on the frontend's /metrics: requests by outcome, tokens used (settled), limit
 * hits by limit, the budgets' remaining tokens, and the shared store's outages. Labels are bounded:
 * the first MAX_TENANT_LABELS tenants seen, then `other`.
 */
export function createLimitMetrics(registry: Registry) {
  const named = new Set<string>();
  const label = (tenant: string) => {
    if (named.has(tenant)) return tenant;
    if (named.size < MAX_TENANT_LABELS) {
      named.add(tenant);
      return tenant;
    }
    return 'other';
  };
  let view: BudgetView | undefined;
  const requests = new Counter({
    name: 'ebb_frontend_tenant_requests_total',
    help: 'Requests of tenants with limits (--limits-file), by tenant and outcome: admitted, limited (429), unavailable (503: the shared limits unreadable, failing closed)',
    labelNames: ['tenant', 'outcome'],
    registers: [registry],
  });
  const tokens = new Counter({ name: 'ebb_frontend_tenant_tokens_total', help: 'Tokens tenants with limits used (prompt and completion, as each answer counted them; a reservation whose answer did not count them: what it reserved)', labelNames: ['tenant'], registers: [registry] });
  const hits = new Counter({ name: 'ebb_frontend_tenant_limit_hits_total', help: 'Requests refused by a tenant limit, by tenant and limit', labelNames: ['tenant', 'limit'], registers: [registry] });
  new Gauge({
    name: 'ebb_frontend_tenant_budget_remaining_tokens',
    help: "Tokens left of a tenant's budget for the current UTC day or month, as this frontend last read it",
    labelNames: ['tenant', 'period'],
    registers: [registry],
    collect() {
      this.reset();
      if (view !== undefined) for (const [tenant, period, remaining] of view.budgets()) this.set({ tenant: label(tenant), period }, remaining);
    },
  });
  const fallbacks = new Counter({
    name: 'ebb_frontend_limits_store_unavailable_total',
    help: 'Requests whose limits could not be counted in the shared store (Redis), by what the frontend did: open (counted in this frontend alone), closed (503)',
    labelNames: ['mode'],
    registers: [registry],
  });
  return {
    observe: (v: BudgetView) => void (view = v),
    admitted: (tenant: string) => requests.inc({ tenant: label(tenant), outcome: 'admitted' }),
    limited: (tenant: string, limit: LimitName) => {
      requests.inc({ tenant: label(tenant), outcome: 'limited' });
      hits.inc({ tenant: label(tenant), limit });
    },
    unavailable: (tenant: string) => requests.inc({ tenant: label(tenant), outcome: 'unavailable' }),
    used: (tenant: string, n: number) => tokens.inc({ tenant: label(tenant) }, n),
    fallback: (mode: 'open' | 'closed') => fallbacks.inc({ mode }),
  };
}

export type LimitMetrics = ReturnType<typeof createLimitMetrics>;
