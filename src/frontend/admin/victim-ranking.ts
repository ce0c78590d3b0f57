import type { WorkerStatus } from '../../protocol/admin.js';
import type { WorkerMode } from '../../protocol/worker-mode.js';

/**
 * Which workers a scale-down takes: the ones whose drain waits least, that throw away least cache,
 * and are youngest. Shared by `ebb scale-down` and the frontend's POST /models/{model}/scale-down;
 * a pure function of the workers' own status reports, so both choose alike.
 *
 * Order, per pool (a model's prefill and decode workers are ranked apart: they are not
 * interchangeable):
 *   1. the drain ETA the worker would have if drained now (`eta_if_drained_ms`; unknown sorts last),
 *      then its in-flight requests;
 *   2. the prefix-cache blocks it holds (`kv_cache.cached_blocks`; absent = 0): what routing loses;
 *   3. the youngest first (`started_at`): the least proven, and the one a ReplicaSet would pick too.
 */

/** A serving worker as the ranking sees it. */
export interface Candidate {
  worker_id: string;
  mode: WorkerMode;
  status: WorkerStatus;
}

export interface RankedWorker {
  worker_id: string;
  pool: WorkerMode;
  /** 1 = the first to go. */
  rank: number;
  eta_if_drained_ms: number | null;
  inflight_requests: number;
  cached_blocks: number;
  started_at: string | null;
  /** Why it stands where it does, in words. */
  reason: string;
}

/** The cache value of a worker: its cached prefix blocks, where its engine reports them. */
export function cachedBlocksOf(status: WorkerStatus): number {
  const kv = (status as { kv_cache?: { cached_blocks?: unknown } }).kv_cache;
  const n = kv?.cached_blocks;
  return typeof n === 'number' && Number.isFinite(n) && n >= 0 ? n : 0;
}

const etaOf = (s: WorkerStatus): number | null => (typeof s.eta_if_drained_ms === 'number' ? s.eta_if_drained_ms : null);
const startOf = (s: WorkerStatus): number => {
  const t = typeof s.started_at === 'string' ? Date.parse(s.started_at) : NaN;
  return Number.isNaN(t) ? -Infinity : t;
};

function seconds(ms: number): string {
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`;
}

function reasonFor(w: Omit<RankedWorker, 'reason' | 'rank'>): string {
  const work =
    w.inflight_requests === 0 && w.eta_if_drained_ms === 0
      ? 'idle: nothing to wait for'
      : w.eta_if_drained_ms === null
        ? `drain time unknown with ${w.inflight_requests} in flight (ranked after every known one)`
        : `its work ends in ${seconds(w.eta_if_drained_ms)} (${w.inflight_requests} in flight)`;
  return `${work}; ${w.cached_blocks} cached block${w.cached_blocks === 1 ? '' : 's'}; started ${w.started_at ?? 'at an unknown time'}`;
}

/** `a` before `b`: less work to wait for, then less cache, then younger, then by id (stable output). */
export function compareVictims(a: Candidate, b: Candidate): number {
  const ea = etaOf(a.status) ?? Infinity;
  const eb = etaOf(b.status) ?? Infinity;
  if (ea !== eb) return ea < eb ? -1 : 1;
  if (a.status.inflight_requests !== b.status.inflight_requests) return a.status.inflight_requests - b.status.inflight_requests;
  const ca = cachedBlocksOf(a.status);
  const cb = cachedBlocksOf(b.status);
  if (ca !== cb) return ca - cb;
  const sa = startOf(a.status);
  const sb = startOf(b.status);
  if (sa !== sb) return sb - sa > 0 ? 1 : -1;
  return a.worker_id.localeCompare(b.worker_id);
}

/** Every pool of the candidates, each ranked (first = first to go). */
export function rankPools(candidates: readonly Candidate[]): Map<WorkerMode, RankedWorker[]> {
  const pools = new Map<WorkerMode, Candidate[]>();
  for (const c of candidates) pools.set(c.mode, [...(pools.get(c.mode) ?? []), c]);
  const ranked = new Map<WorkerMode, RankedWorker[]>();
  for (const [pool, members] of [...pools].sort(([a], [b]) => a.localeCompare(b))) {
    ranked.set(
      pool,
      [...members].sort(compareVictims).map((c, i) => {
        const base = {
          worker_id: c.worker_id,
          pool,
          eta_if_drained_ms: etaOf(c.status),
          inflight_requests: c.status.inflight_requests,
          cached_blocks: cachedBlocksOf(c.status),
          started_at: typeof c.status.started_at === 'string' ? c.status.started_at : null,
        };
        return { ...base, rank: i + 1, reason: reasonFor(base) };
      }),
    );
  }
  return ranked;
}

export type ChoiceProblem = { kind: 'no_workers' | 'pool_needed' | 'no_such_pool' | 'too_many' | 'not_serving' | 'unanswered'; message: string };

/**
 * The `count` victims of `model`'s pool `pool` (optional when the model has one pool), or exactly
 * the `named` ones (what a dry run showed; refused if one is no longer serving). A scale-down
 * leaves at least one serving worker in the pool: what victims still run is handed to the rest.
 * `unanswered`: the model's workers whose status could not be read; a ranking without them could
 * pass over the best victim, so there is no choice until they answer (named victims need none).
 */
export function chooseVictims(
  model: string,
  candidates: readonly Candidate[],
  count: number,
  pool?: WorkerMode,
  { named, unanswered = [] }: { named?: readonly string[] | undefined; unanswered?: readonly string[] } = {},
): { pool: WorkerMode; ranking: RankedWorker[]; victims: RankedWorker[] } | ChoiceProblem {
  if (named === undefined && unanswered.length > 0)
    return { kind: 'unanswered', message: `worker(s) ${unanswered.join(', ')} of model "${model}" did not answer their status: a ranking without them could pass over the best victim (retry, or name the victims)` };
  const pools = rankPools(candidates);
  if (named !== undefined) {
    const missing = named.filter((id) => !candidates.some((c) => c.worker_id === id));
    if (missing.length > 0) return { kind: 'not_serving', message: `worker(s) ${missing.join(', ')} of model "${model}" no longer serving (or not answering): nothing was drained` };
    if (named.length !== count) return { kind: 'too_many', message: `${named.length} named victim(s) for a scale-down by ${count}` };
  }
  if (pools.size === 0) return { kind: 'no_workers', message: `no serving worker of model "${model}"` };
  let chosen = pool ?? (named?.[0] === undefined ? undefined : candidates.find((c) => c.worker_id === named[0])?.mode);
  if (chosen === undefined) {
    if (pools.size > 1) return { kind: 'pool_needed', message: `model "${model}" has ${[...pools.keys()].join(' and ')} workers, ranked apart: say which pool to scale down` };
    chosen = [...pools.keys()][0] as WorkerMode;
  }
  const ranking = pools.get(chosen);
  if (ranking === undefined) return { kind: 'no_such_pool', message: `model "${model}" has no serving ${chosen} worker (pools: ${[...pools.keys()].join(', ')})` };
  if (count >= ranking.length)
    return { kind: 'too_many', message: `model "${model}" has ${ranking.length} serving ${chosen} worker(s): a scale-down by ${count} would leave none to take over their streams (at most ${ranking.length - 1})` };
  if (named === undefined) return { pool: chosen, ranking, victims: ranking.slice(0, count) };
  const victims = ranking.filter((r) => named.includes(r.worker_id));
  if (victims.length !== named.length) return { kind: 'not_serving', message: `the named victims of model "${model}" are not all ${chosen} workers: one pool at a time` };
  return { pool: chosen, ranking, victims };
}

export const isChoiceProblem = (v: object): v is ChoiceProblem => 'kind' in v;
