import { Counter, Gauge, type Registry } from 'prom-client';
import type { KvFeed } from './kv-feed.js';
import { ROUTER_KINDS, type RouterKind } from './router-kinds.js';

/**
 * The router's metrics, on the frontend's registry. The predicted hit rate is
 * rate(ebb_frontend_kv_overlap_tokens_total) / rate(ebb_frontend_kv_prompt_tokens_total): the
 * prompt tokens the chosen worker was expected to hold, over the prompt tokens routed by kv.
 */
export function createKvRouterMetrics(registry: Registry, feed: KvFeed | undefined) {
  const decisions = new Counter({ name: 'ebb_frontend_routing_decisions_total', help: 'Workers chosen for an attempt, by router (kv, least-loaded, round-robin)', labelNames: ['router'], registers: [registry] });
  const prompt = new Counter({ name: 'ebb_frontend_kv_prompt_tokens_total', help: 'Prompt tokens of requests routed by the kv router', registers: [registry] });
  const overlap = new Counter({ name: 'ebb_frontend_kv_overlap_tokens_total', help: 'Of those, the tokens the chosen worker was predicted to hold in its prefix cache', registers: [registry] });
  // At 0 from the start: an alert or a ratio reads 0, not "no data".
  for (const router of ROUTER_KINDS) decisions.inc({ router }, 0);
  prompt.inc(0);
  overlap.inc(0);
  new Gauge({
    name: 'ebb_frontend_kv_indexed_blocks',
    help: 'Blocks the kv router indexes per worker (exact from its KV events, or approximate from what it was sent)',
    labelNames: ['worker_id'],
    registers: [registry],
    collect() {
      this.reset();
      if (!feed) return;
      for (const [id, h] of feed.index.holders()) this.set({ worker_id: id }, h.blocks.size);
    },
  });
  return {
    decision: (router: RouterKind) => decisions.inc({ router }),
    overlap: (promptTokens: number, cachedTokens: number) => {
      prompt.inc(promptTokens);
      overlap.inc(cachedTokens);
    },
  };
}

export type KvRouterMetrics = ReturnType<typeof createKvRouterMetrics>;
