import type { Logger } from 'pino';
import type { Capability } from '../../protocol/capabilities.js';
import type { GenerateBody } from '../../protocol/request-plane.js';
import type { WorkerMode, WorkerRecord } from '../../discovery/discovery.js';
import type { KvFeed } from './kv-feed.js';
import type { KvRouterMetrics } from './kv-metrics.js';
import { kvProfile, localTokens, promptBlocks, type KvProfile, type PromptBlocks } from './prompt-blocks.js';
import type { PoolWorker, WorkerPool } from './worker-pool.js';
import { adapterView } from './adapter-view.js';
import { adapterRoot } from '../../protocol/block-hash.js';
import type { RouterKind } from './router-kinds.js';
import type { RouteExplain } from '../../tracing/frontend-spans.js';


/**
 * What an in-flight request is worth in the load term, in prompt tokens: a request decoding on a
 * worker slows its batch about as much as prefilling this many tokens would. It keeps a worker
 * that wins every overlap from collecting every request (the sticky-routing spiral).
 */
export const INFLIGHT_COST_TOKENS = 64;

/**
 * What a millisecond of LoRA adapter load is worth in the cost, in prompt tokens: a 500 ms load
 * weighs as much as eight more requests in flight, so a hot adapter spreads to another worker once
 * the workers holding it are that much busier than one that would load it.
 */
export const ADAPTER_LOAD_COST_TOKENS_PER_MS = 1;

/** The default weight of the prefill tokens a worker would have to compute, against its load. */
export const DEFAULT_OVERLAP_WEIGHT = 1;

/** Asks a worker's request plane for a prompt's token ids (POST /tokenize); undefined when it cannot. */
export type Tokenize = (worker: WorkerRecord, body: GenerateBody) => Promise<number[] | undefined>;

export interface RouterOptions {
  kind: RouterKind;
  /** Weight of the uncached prompt tokens against the load (queued prefill tokens, in-flight); default 1. */
  overlapWeight?: number | undefined;
  feed?: KvFeed | undefined;
  metrics?: KvRouterMetrics | undefined;
  tokenize?: Tokenize | undefined;
  log?: Logger | undefined;
}

/** One request's prompt in the token spaces of its model's workers, computed once for all its attempts. */
export interface RouteHint {
  model: string;
  /** The prompt's length in tokens (the engine's, where the frontend knows it). */
  tokens: number;
  spaces: Map<string, PromptBlocks>;
  /** What the last pick predicted for the worker it chose. */
  chosen?: { workerId: string; cachedTokens: number } | undefined;
  /** The LoRA adapter the request names: its blocks are salted with it, and a load counts in the cost. */
  adapter?: string | undefined;
}

interface Scored {
  worker: PoolWorker;
  cached: number;
  cost: number;
  /** The live cached tokens its prefill would evict there, as predicted (evictionCost). */
  evicts: number;
  /** When it was last busy as this frontend knows (the tie-break), computed for a tie only (-1 until then). */
  active: number;
}

/**
 * How long prefills queued on a worker hold up a new one of `tokens` uncached tokens, in tokens:
 * engines interleave prefills (vLLM's and SGLang's chunked prefill, the mocker's shared compute),
 * so a queued prefill holds the new one up by at most the new one's own size, not by all of its
 * own. A conversation's next turn (a few uncached tokens) is not sent away from its cache because a
 * new conversation's long prompt is being prefilled there.
 */
export function prefillWait(queued: readonly number[], tokens: number): number {
  let wait = 0;
  for (const q of queued) wait += q < tokens ? q : tokens;
  return wait;
}

/**
 * The cached tokens of live prompts that prefilling `uncached` tokens on a worker would evict, as
 * predicted: each block stored pushes the least recently used one out of a full cache, and it is a
 * live prompt's (one its conversation will send again, to be prefilled anew) about as often as the
 * cache holds lately stored blocks, `recent` of `scale` (the worker's capacity, or the most any
 * worker of the model stored lately when that is more: with every cache turning over, the one that
 * stored the most lately evicts live blocks with each block). A conversation's next turn (a few
 * uncached tokens) costs next to nothing here, so it is never moved by it; a new conversation
 * goes where it evicts the least, and the caches hold as many conversations each.
 */
export function evictionCost(uncached: number, recent: number, scale: number): number {
  return scale > 0 ? Math.round((uncached * Math.min(recent, scale)) / scale) : 0;
}

/**
 * Chooses the worker for each attempt. `least-loaded`: fewest in-flight (the pool's heap).
 * `round-robin`: the one picked longest ago. `kv`: the lowest cost among the eligible workers,
 *   cost = overlapWeight x u + prefillWait(its queued prefills, u) + INFLIGHT_COST_TOKENS x its in-flight
 *        + evictionCost(u, what it stored lately, its capacity),
 * u being the prompt tokens it has not cached, so a worker holding the prompt wins unless the work
 * already waiting on it outweighs what it saves. The last term (workers whose KV events name their
 * capacity) reads what every frontend reads alike, so frontends balance the caches as one would.
 * Eligibility (in discovery, not held, not tried, capabilities) is the pool's and comes first:
 * a draining or drained worker is never scored, whatever it holds.
 */
export class Router {
  readonly kind: RouterKind;
  private readonly weight: number;
  /** Per worker, the uncached prompt tokens of each request sent there whose first token has not come back yet. */
  private readonly queued = new Map<string, number[]>();
  /** When this frontend last chose each worker (performance.now()); a worker gone from the pool goes from here too. */
  private readonly chosenAt = new WeakMap<PoolWorker, number>();

  constructor(
    private readonly pool: WorkerPool,
    private readonly opts: RouterOptions,
  ) {
    this.kind = opts.kind;
    this.weight = opts.overlapWeight ?? DEFAULT_OVERLAP_WEIGHT;
  }

  /** How `worker`-tokenizer models get token ids (set once the request plane's agent exists). */
  setTokenizer(tokenize: Tokenize): void {
    this.opts.tokenize = tokenize;
  }

  /** Queued prefill tokens the router counts on `workerId` (for /workers and the debug line). */
  queuedPrefill(workerId: string): number {
    let sum = 0;
    for (const q of this.queued.get(workerId) ?? []) sum += q;
    return sum;
  }

  /**
   * The request's blocks in each token space its model's eligible workers use; undefined when there
   * is nothing to score (another router, or a single eligible worker: tokenizing costs the hot path).
   */
  async prepare(body: GenerateBody, mode: WorkerMode, tried: ReadonlySet<string>, needs: readonly Capability[]): Promise<RouteHint | undefined> {
    if (this.kind !== 'kv' || !this.opts.feed) return undefined;
    const eligible = this.pool.eligible(body.model, mode, tried, needs, undefined, body.adapter);
    if (eligible.length < 2) return undefined;
    // Two adapters (and the base model) never share a cached block: salted only when one is named.
    const root = adapterRoot(body.adapter);
    const spaces = new Map<string, PromptBlocks>();
    let tokens: number | undefined;
    let chars: number | undefined;
    for (const p of this.opts.feed.spacesOf(body.model)) {
      if (p.space === 'worker') {
        // One worker answers for all (same model, same tokenizer): an eligible one that declares it.
        const asked = this.opts.tokenize && eligible.find((w) => kvProfile(w.record).key === p.key);
        if (!asked) continue;
        const ids = await this.opts.tokenize!(asked.record, body).catch(() => undefined);
        if (ids === undefined) continue;
        spaces.set(p.key, promptBlocks(ids, p.blockSize, root));
        tokens = ids.length;
      } else {
        const b = promptBlocks(localTokens(body, p.space), p.blockSize, root);
        spaces.set(p.key, b);
        if (p.space === 'chars') chars = b.tokens;
        else tokens ??= b.tokens;
      }
    }
    // Without a token count, about four characters a token.
    return { model: body.model, tokens: tokens ?? Math.ceil((chars ?? 0) / 4), spaces, adapter: body.adapter };
  }

  /** The worker for the next attempt, or undefined when none is eligible; `explain` (tracing) is told why. */
  pick(model: string, mode: WorkerMode, tried: ReadonlySet<string>, needs: readonly Capability[], hint?: RouteHint, adapter?: string, explain?: RouteExplain): PoolWorker | undefined {
    let w: PoolWorker | undefined;
    if (this.kind === 'least-loaded' || (this.kind === 'kv' && hint === undefined)) {
      // Counted before the pick: picking moves the worker in the heap, never out of the eligible.
      const candidates = explain === undefined ? 0 : this.pool.eligible(model, mode, tried, needs, undefined, adapter).length;
      w = this.pool.pick(model, mode, tried, needs, undefined, adapter);
      if (w && explain) explain({ router: this.kind === 'kv' ? 'kv (by load: one candidate, or no prompt to score)' : this.kind, candidates, chosen: w.record.worker_id });
    } else if (this.kind === 'round-robin') {
      const eligible = this.pool.eligible(model, mode, tried, needs, undefined, adapter);
      for (const c of eligible) if (w === undefined || c.pickedAt < w.pickedAt) w = c;
      if (w) this.pool.picked(w);
      if (w && explain) explain({ router: this.kind, candidates: eligible.length, chosen: w.record.worker_id });
    } else w = this.score(model, mode, tried, needs, hint!, explain);
    if (w) this.opts.metrics?.decision(this.kind);
    return w;
  }

  private score(model: string, mode: WorkerMode, tried: ReadonlySet<string>, needs: readonly Capability[], hint: RouteHint, explain?: RouteExplain): PoolWorker | undefined {
    const feed = this.opts.feed!;
    const eligible = this.pool.eligible(model, mode, tried, needs, undefined, hint.adapter);
    const now = Date.now();
    // One walk of the index per token space (most models have one).
    const queries = new Map<string, number>();
    for (const [key, blocks] of hint.spaces) if (blocks.tokens > 0) queries.set(key, feed.index.query(model, blocks.hashes, now));
    // The most any worker of the model stored lately (blocks): evictionCost's scale where caches turn over.
    const at = performance.now();
    const recentMax = feed.index.recentMax(model, at);
    let best: Scored | undefined;
    const debug = this.opts.log?.isLevelEnabled('debug') === true;
    const scored: Scored[] | undefined = debug || explain !== undefined ? [] : undefined;
    for (const worker of eligible) {
      const p: KvProfile = kvProfile(worker.record);
      const key = p.key;
      const q = queries.get(key);
      let cached = 0;
      if (q !== undefined) {
        const overlap = feed.index.overlap(q, worker.record.worker_id);
        if (overlap > 0) cached = Math.min(hint.tokens, Math.round((overlap * p.blockSize * hint.tokens) / hint.spaces.get(key)!.tokens));
      }
      const id = worker.record.worker_id;
      const uncached = hint.tokens - cached;
      const queued = this.queued.get(id);
      // What this frontend sent there, and what the others did (the worker's load events: none with one frontend).
      const others = feed.load.of(id);
      let wait = queued === undefined ? 0 : prefillWait(queued, uncached);
      let load = worker.load;
      if (others !== undefined) {
        wait += others.prefillMax <= uncached ? others.prefillSum : prefillWait(others.prefill, uncached);
        load += others.inflight;
      }
      let evicts = 0;
      if (recentMax > 0 && uncached > 0) {
        const h = feed.index.holder(id);
        if (h !== undefined && h.capacityBlocks > 0) evicts = evictionCost(uncached, h.recentBlocks(at), Math.max(h.capacityBlocks, recentMax));
      }
      let cost = this.weight * uncached + wait + INFLIGHT_COST_TOKENS * load + evicts;
      if (hint.adapter !== undefined) cost += adapterLoadCost(worker, hint.adapter);
      const s: Scored = { worker, cached, cost, evicts, active: -1 };
      scored?.push(s);
      if (best === undefined || cost < best.cost || (cost === best.cost && this.busySooner(best, s, feed))) best = s;
    }
    if (!best) return undefined;
    this.pool.picked(best.worker);
    this.chosenAt.set(best.worker, performance.now());
    hint.chosen = { workerId: best.worker.record.worker_id, cachedTokens: best.cached };
    if (scored) {
      scored.sort((a, b) => a.cost - b.cost);
      const scores = scored.slice(0, 8).map((s) => {
        const id = s.worker.record.worker_id;
        const others = feed.load.of(id);
        const elsewhere = others === undefined ? undefined : { inflight: others.inflight, queued_prefill_tokens: others.prefillSum };
        return { worker_id: id, cached_tokens: s.cached, queued_prefill_tokens: this.queuedPrefill(id), inflight: s.worker.load, ...(elsewhere !== undefined && { other_frontends: elsewhere }), evicts_tokens: s.evicts, cost: s.cost };
      });
      explain?.({ router: this.kind, candidates: eligible.length, chosen: best.worker.record.worker_id, promptTokens: hint.tokens, cachedTokens: best.cached, cost: best.cost, scores });
      if (debug)
        this.opts.log?.debug(
          { event: 'route_decision', router: this.kind, model, mode, worker_id: best.worker.record.worker_id, prompt_tokens: hint.tokens, scores },
          `routed to ${best.worker.record.worker_id}: ${best.cached}/${hint.tokens} prompt tokens cached there (cost ${best.cost}, ${eligible.length} eligible)`,
        );
    }
    return best.worker;
  }

  /**
   * Of two workers that cost the same, whether `b` was busy longer ago than `a` (so it takes the
   * request): chosen here, or storing blocks for anyone (its KV events, which every frontend sees
   * alike, so frontends spread their new prompts as one would); then the one this frontend picked longest ago.
   */
  private busySooner(a: Scored, b: Scored, feed: KvFeed): boolean {
    const active = (s: Scored) => (s.active >= 0 ? s.active : (s.active = Math.max(this.chosenAt.get(s.worker) ?? 0, feed.index.holder(s.worker.record.worker_id)?.storedAt ?? 0)));
    const ta = active(a);
    const tb = active(b);
    return tb < ta || (tb === ta && b.worker.pickedAt < a.worker.pickedAt);
  }

  /** The prompt tokens `worker` must prefill for the request, as predicted (undefined: nothing was predicted). */
  prefillOn(worker: PoolWorker, hint: RouteHint | undefined): number | undefined {
    if (hint === undefined) return undefined;
    const cached = hint.chosen?.workerId === worker.record.worker_id ? hint.chosen.cachedTokens : 0;
    return Math.max(0, hint.tokens - cached);
  }

  /**
   * An attempt on `worker` starts: its uncached tokens count as queued prefill there until the
   * returned function (idempotent) says the first token came back, or the attempt failed.
   */
  begin(worker: PoolWorker, hint: RouteHint | undefined): () => void {
    const tokens = this.prefillOn(worker, hint);
    if (tokens === undefined) return () => undefined;
    const id = worker.record.worker_id;
    if (tokens === 0) return () => undefined;
    let list = this.queued.get(id);
    if (list === undefined) this.queued.set(id, (list = []));
    list.push(tokens);
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      const now = this.queued.get(id);
      if (now === undefined) return;
      const at = now.indexOf(tokens);
      if (at >= 0) now.splice(at, 1);
      if (now.length === 0) this.queued.delete(id);
    };
  }

  /** The attempt on `worker` was admitted: counted in the hit rate, and remembered where the worker publishes no events. */
  routed(worker: PoolWorker, hint: RouteHint | undefined): void {
    if (hint === undefined) return;
    const cached = hint.chosen?.workerId === worker.record.worker_id ? hint.chosen.cachedTokens : 0;
    this.opts.metrics?.overlap(hint.tokens, cached);
    const p = kvProfile(worker.record);
    const blocks = hint.spaces.get(p.key);
    if (p.events === 'none' && blocks !== undefined) this.opts.feed?.sent(worker.record, blocks.hashes);
  }
}

/**
 * What naming `adapter` costs on `worker`: nothing where it is resident (serving, or loading: the
 * load is under way), its typical load time where it would be loaded, doubled where no slot is free
 * (an idle adapter is evicted first, and the worker refuses when none is idle).
 */
function adapterLoadCost(worker: PoolWorker, adapter: string): number {
  const v = adapterView(worker.record);
  if (v.resident.has(adapter)) return 0;
  return ADAPTER_LOAD_COST_TOKENS_PER_MS * v.loadMs * (v.free > 0 ? 1 : 2);
}
