import type { ModelSummary } from '../model-stats.js';

/** A worker's routing figures in GET /workers (`kv`): the router kind, queued prefill, the KV feed's state. */
export type KvView = Record<string, unknown> & { queued_prefill_tokens?: number };

/** What one frontend process's admin API would show of its own routing and traffic. */
export interface AdminView {
  kv: Record<string, KvView>;
  models: ModelSummary[];
}

/**
 * The primary's admin view of all processes, from each one's latest view: queued prefill and
 * request counts are summed; the KV feed's state is the first process's (every process follows the
 * same workers); a model's TTFT percentiles are the slowest process's (percentiles do not add up).
 */
export function mergeKv(views: AdminView[], workerId: string): KvView | null {
  const of = views.flatMap((v) => (v.kv[workerId] ? [v.kv[workerId]!] : []));
  if (of.length === 0) return null;
  return { ...of[0], queued_prefill_tokens: of.reduce((a, k) => a + (k.queued_prefill_tokens ?? 0), 0) };
}

/** Two processes' counts by key (tiers), summed. */
function addCounts(a: Record<string, number> | undefined, b: Record<string, number> | undefined): Record<string, number> {
  const out = { ...a };
  for (const [k, n] of Object.entries(b ?? {})) out[k] = (out[k] ?? 0) + n;
  return out;
}

export function mergeModels(views: AdminView[]): ModelSummary[] {
  const byModel = new Map<string, ModelSummary>();
  const slower = (a: number | null, b: number | null) => (a === null ? b : b === null ? a : Math.max(a, b));
  for (const m of views.flatMap((v) => v.models)) {
    const was = byModel.get(m.model);
    byModel.set(
      m.model,
      was === undefined
        ? { ...m, rate_series: [...m.rate_series] }
        : {
            model: m.model,
            requests_per_s: Math.round((was.requests_per_s + m.requests_per_s) * 10) / 10,
            requests: was.requests + m.requests,
            errors: was.errors + m.errors,
            shed: was.shed + (m.shed ?? 0),
            ttft_p50_ms: slower(was.ttft_p50_ms, m.ttft_p50_ms),
            ttft_p95_ms: slower(was.ttft_p95_ms, m.ttft_p95_ms),
            rate_series: was.rate_series.map((n, i) => n + (m.rate_series[i] ?? 0)),
            queued: was.queued + (m.queued ?? 0),
            queued_by_tier: addCounts(was.queued_by_tier, m.queued_by_tier),
          },
    );
  }
  return [...byModel.values()].sort((a, b) => a.model.localeCompare(b.model));
}
