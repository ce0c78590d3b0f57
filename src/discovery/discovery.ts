import type { WorkerMode } from '../protocol/worker-mode.js';
import type { DrainIntentStore } from './drain-intent.js';
import type { RouteMarks } from './route-marks.js';
import type { ScaleDownLocks } from './scale-down-lock.js';
import type { AnyRecord, LoadingRecord, WorkerRecord } from './worker-record.js';

/** Re-exported for the modules that import them from here: WorkerMode lives in protocol/, the record in worker-record.ts. */
export type { WorkerMode };
export { isLoading, isWorkerRecord, type AnyRecord, type LoadingRecord, type WorkerRecord } from './worker-record.js';

/**
 * The registry the frontend routes from. Workers register one record each; the frontend lists then
 * watches. Backends: in-process (memory:), one machine (file:), a cluster (etcd:).
 */

export interface DiscoveryOptions {
  /** Lease TTL for registrations this process makes. */
  leaseTtlMs?: number | undefined;
}

/**
 * `reset` carries the whole current set: sent first, and again whenever the backend had to
 * resynchronise (after a reconnect), so a watcher never depends on having seen every event.
 */
export type DiscoveryEvent =
  | { type: 'reset'; records: WorkerRecord[] }
  | { type: 'put'; record: WorkerRecord }
  | { type: 'delete'; worker_id: string };

/**
 * What watchAll delivers: the serving records as `watch` does, and the loading ones (workers whose
 * engine loads) beside them. A worker goes loading -> put (it serves) or loading -> delete (it never
 * came up); a `reset` carries both sets. A DiscoveryEvent is one too (a reset without loading records).
 */
export type FleetEvent =
  | { type: 'reset'; records: WorkerRecord[]; loading?: LoadingRecord[] | undefined }
  | { type: 'put'; record: WorkerRecord }
  | { type: 'loading'; record: LoadingRecord }
  | { type: 'delete'; worker_id: string };

export interface DiscoveryWatch {
  close(): Promise<void>;
}

export interface Discovery {
  /** Human-readable location, for logs. */
  readonly url: string;
  /** A loading record first (while the engine loads), then the serving one under the same key. */
  register(record: AnyRecord): Promise<void>;
  unregister(workerId: string): Promise<void>;
  /** The serving records. */
  list(): Promise<WorkerRecord[]>;
  /** Delivers a `reset` with the listed set first, then every change after it: serving records only. */
  watch(listener: (event: DiscoveryEvent) => void): Promise<DiscoveryWatch>;
  /** As watch, with the loading records too. */
  watchAll(listener: (event: FleetEvent) => void): Promise<DiscoveryWatch>;
  /** Fires when a registration this process holds was lost (lease expired) and must be redone. */
  onRegistrationLost(listener: (workerId: string) => void): () => void;
  /** Drain intents that survive a restart of the worker (etcd); absent for one-machine backends. */
  readonly drainIntents?: DrainIntentStore | undefined;
  /** One scale-down of a model at a time, across every CLI and frontend on this discovery. */
  readonly scaleDownLocks: ScaleDownLocks;
  /** Which workers each frontend routes to (a worker's /ready waits for every frontend's mark). */
  readonly routeMarks: RouteMarks;
  close(): Promise<void>;
}
