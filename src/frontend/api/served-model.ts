import type { GenerateBody } from '../../protocol/request-plane.js';
import { noServingWorker, unavailableModel } from '../relay/worker-answer.js';
import type { WorkerPool } from '../routing/worker-pool.js';

/** What a request's `model` names: a base model, or a LoRA adapter over one (vLLM's convention). */
export interface Served {
  /** The base model: what workers serve and routing indexes by. */
  model: string;
  adapter?: string | undefined;
}

/**
 * Resolves a request's `model`: a model some worker serves, else an adapter some worker can load
 * (its base model found in the pool's count: no work per request for a base model). 404 for
 * neither; 503 for one whose workers are all out of discovery lately (draining, restarting), unless
 * `queueing`: then a known model (or an adapter of one) waits in its queue for a worker to come.
 */
export function servedAs(pool: WorkerPool, name: string, queueing = false): Served {
  if (pool.hasModel(name)) return { model: name };
  const a = pool.adapterBase(name);
  if (a === undefined) {
    if (queueing && pool.knows(name)) return { model: name };
    throw unavailableModel(pool, name);
  }
  if (!a.inDiscovery && !(queueing && pool.knows(a.base))) throw noServingWorker(`no worker that can load adapter "${name}" is serving right now (draining, drained or restarting); retry shortly`);
  return { model: a.base, adapter: name };
}

/** The worker requests of a request naming an adapter run on its base model, with the adapter named. */
export function onServed(gens: GenerateBody[], served: Served): GenerateBody[] {
  if (served.adapter !== undefined)
    for (const g of gens) {
      g.model = served.model;
      g.adapter = served.adapter;
    }
  return gens;
}
