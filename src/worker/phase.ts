import type { RoutedLoad } from './routed-load.js';
import type { PriorityReserve } from './priority-reserve.js';
import type { Engine } from '../engine/engine.js';
import type { Lifecycle } from '../lifecycle/lifecycle.js';
import type { WorkerMetrics } from './metrics.js';
import type { WorkerAdapters } from './adapters.js';
import type { RoutedBy } from './routed-by.js';

/** What the system server answers from once the engine can serve. */
export interface WorkerRuntime {
  lifecycle: Lifecycle;
  engine: Engine;
  metrics: WorkerMetrics;
  /** The drain ETA (ms) the worker would have if drained now, from its in-flight work; null when unknown. */
  drainEta: () => number | null;
  /** The engine's LoRA adapters, where it has any. */
  adapters?: WorkerAdapters | undefined;
  /** The batch slots flex requests leave free: its status says whether flex would be admitted now. */
  priorityReserve?: PriorityReserve | undefined;
  /** What each routing frontend has in flight here (told on the KV event stream). */
  routedLoad?: RoutedLoad | undefined;
  /** Whether the frontends route to it (their marks in discovery): /ready waits for it. */
  routedBy?: RoutedBy | undefined;
}

/**
 * The worker process beside its lifecycle, which holds the state from the start (`loading` while
 * the engine loads: a real model takes seconds to minutes, and the system server must answer
 * meanwhile, /live 200 and /health 503, without the worker being in discovery; `failed` once the
 * engine died under it): the parts that exist only once the engine does.
 */
export class WorkerPhase {
  private current: WorkerRuntime | undefined;

  constructor(readonly lifecycle: Lifecycle) {}

  get runtime(): WorkerRuntime | undefined {
    return this.current;
  }

  running(runtime: WorkerRuntime): void {
    this.current = runtime;
  }
}
