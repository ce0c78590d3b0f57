import type { Dispatcher } from 'undici';
import type { Quiescence, SchedulerGauges } from './engine.js';
import { describeError, getBounded } from './engine-http.js';
import { MetricsFormatError, readSamples, sumGauge } from './prometheus-text.js';
import type { EngineKind, QuiescenceMode } from './openai-engine-options.js';
export { ENGINE_KINDS, QUIESCENCE_MODES, type EngineKind, type QuiescenceMode } from './openai-engine-options.js';

/** Bound on one metrics read: a slower answer is `unknown`, never a wait that holds the drain. */
export const PROBE_TIMEOUT_MS = 1000;

export interface EngineIdlenessProbe {
  probe(): Promise<Quiescence>;
  /** False when the answer can never change by asking again (generic): no re-probing. */
  readonly canChange: boolean;
}

/**
 * The documented pending-work gauges of each engine, summed over their label sets. `optional`
 * gauges count when the page has them (older or newer releases add queues). `kv`: its KV cache use
 * (0 to 1), the first of these names the page has (vLLM renamed it).
 */
const GAUGES: Record<Exclude<EngineKind, 'generic'>, { running: string; queued: string; optional: string[]; kv: string[] }> = {
  // vLLM: scheduler state, labelled by model_name (and engine index with data parallelism).
  vllm: { running: 'vllm:num_requests_running', queued: 'vllm:num_requests_waiting', optional: ['vllm:num_requests_swapped'], kv: ['vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc'] },
  // SGLang (server started with --enable-metrics): labelled by model_name (and rank).
  sglang: { running: 'sglang:num_running_reqs', queued: 'sglang:num_queue_reqs', optional: ['sglang:num_grammar_queue_reqs'], kv: ['sglang:token_usage'] },
  // llama.cpp's llama-server (started with --metrics): unlabelled.
  llamacpp: { running: 'llamacpp:requests_processing', queued: 'llamacpp:requests_deferred', optional: [], kv: ['llamacpp:kv_cache_usage_ratio'] },
};

/** The page's pending-work gauges (MetricsFormatError when one is missing or unreadable) and its KV use where it has one. */
function readGauges(kind: Exclude<EngineKind, 'generic'>, text: string): SchedulerGauges {
  const g = GAUGES[kind];
  const samples = readSamples(text, [g.running, g.queued, ...g.optional, ...g.kv]);
  const running = sumGauge(samples, g.running);
  const waiting = sumGauge(samples, g.queued) + g.optional.reduce((n, name) => n + (samples.has(name) ? sumGauge(samples, name) : 0), 0);
  // Data-parallel engines each have their own cache: the fullest one is what a new request may meet.
  const kv = g.kv.map((name) => samples.get(name)).find((list) => list !== undefined && list.length > 0);
  const usage = kv === undefined ? undefined : Math.max(...kv.map((s) => s.value));
  return { running, waiting, ...(usage !== undefined && Number.isFinite(usage) ? { kv_cache_usage: usage } : {}) };
}

/** The engine server's scheduler gauges now, for the worker's picker metrics; undefined when its page cannot be read. */
export async function readSchedulerGauges(kind: EngineKind, baseUrl: string, dispatcher: Dispatcher, timeoutMs = PROBE_TIMEOUT_MS): Promise<SchedulerGauges | undefined> {
  if (kind === 'generic') return undefined;
  try {
    const page = await getBounded(`${baseUrl}/metrics`, dispatcher, timeoutMs);
    return page.status === 200 ? readGauges(kind, page.text) : undefined;
  } catch {
    return undefined;
  }
}

const unknown = (reason: string): Quiescence => ({ state: 'unknown', reason });

/** Reads the engine's /metrics page and turns its pending-work gauges into an answer; every doubt is `unknown`. */
async function probeMetrics(kind: Exclude<EngineKind, 'generic'>, baseUrl: string, dispatcher: Dispatcher, timeoutMs: number): Promise<Quiescence | { status: number }> {
  const url = `${baseUrl}/metrics`;
  let page;
  try {
    page = await getBounded(url, dispatcher, timeoutMs);
  } catch (err) {
    return unknown(`${kind} metrics: ${describeError(err)}`);
  }
  if (page.status !== 200) return { status: page.status };
  try {
    const { running, waiting: queued } = readGauges(kind, page.text);
    if (running === 0 && queued === 0) return { state: 'idle' };
    return { state: 'busy', waiting_for: [`engine (${kind}): ${running} running, ${queued} queued request${running + queued === 1 ? '' : 's'} (${url})`] };
  } catch (err) {
    if (err instanceof MetricsFormatError) return unknown(`${kind} metrics at ${url} unreadable: ${err.message}`);
    throw err;
  }
}

/**
 * llama-server without --metrics: /slots lists each slot and whether it is processing. It cannot
 * see requests deferred for want of a free slot, so it is the weaker of llama.cpp's two signals.
 */
async function probeSlots(baseUrl: string, dispatcher: Dispatcher, timeoutMs: number, metricsStatus: number): Promise<Quiescence> {
  const url = `${baseUrl}/slots`;
  let page;
  try {
    page = await getBounded(url, dispatcher, timeoutMs);
  } catch (err) {
    return unknown(`llamacpp: /metrics answered ${metricsStatus} and /slots failed: ${describeError(err)}`);
  }
  if (page.status !== 200) return unknown(`llamacpp: /metrics answered ${metricsStatus} and /slots ${page.status}; start llama-server with --metrics`);
  let slots: unknown;
  try {
    slots = JSON.parse(page.text);
  } catch {
    return unknown(`llamacpp: /slots at ${url} is not JSON`);
  }
  if (!Array.isArray(slots) || slots.length === 0) return unknown(`llamacpp: /slots at ${url} is not a list of slots`);
  let processing = 0;
  for (const s of slots as Array<Record<string, unknown>>) {
    // Newer builds say is_processing; older ones a state number (0 = idle).
    if (typeof s?.is_processing === 'boolean') processing += s.is_processing ? 1 : 0;
    else if (typeof s?.state === 'number') processing += s.state === 0 ? 0 : 1;
    else return unknown(`llamacpp: /slots at ${url} has a slot without is_processing or state`);
  }
  return processing === 0 ? { state: 'idle' } : { state: 'busy', waiting_for: [`engine (llamacpp): ${processing} slot${processing === 1 ? '' : 's'} processing (${url})`] };
}

export function createIdlenessProbe(kind: EngineKind, mode: QuiescenceMode, baseUrl: string, dispatcher: Dispatcher, timeoutMs = PROBE_TIMEOUT_MS): EngineIdlenessProbe {
  // ebb's own count is checked by the adapter and the lifecycle before any probe: nothing more to ask.
  if (mode === 'trust-inflight') return { canChange: false, probe: async () => ({ state: 'idle' }) };
  if (kind === 'generic') {
    const answer = unknown(
      'a generic engine cannot report its own pending work; the drain stays draining. ' +
        'Set --engine-kind if the server is vLLM, SGLang or llama.cpp, or --engine-quiescence trust-inflight to trust ebb\'s own in-flight count (weaker: work the engine still holds is not seen)',
    );
    return { canChange: false, probe: async () => answer };
  }
  return {
    canChange: true,
    async probe() {
      const q = await probeMetrics(kind, baseUrl, dispatcher, timeoutMs);
      if ('state' in q) return q;
      if (kind === 'llamacpp' && (q.status === 501 || q.status === 404)) return probeSlots(baseUrl, dispatcher, timeoutMs, q.status);
      const hint = kind === 'sglang' ? ' (start SGLang with --enable-metrics)' : kind === 'llamacpp' ? ' (start llama-server with --metrics)' : '';
      return unknown(`${kind} metrics: GET ${baseUrl}/metrics answered ${q.status}${hint}`);
    },
  };
}
