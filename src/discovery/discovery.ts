import { isCapabilities, type EngineCapabilities } from '../protocol/capabilities.js';
import { isWorkerMode, type WorkerMode } from '../protocol/worker-mode.js';
import type { DrainIntentStore } from './drain-intent.js';
import { isWorkerId } from './worker-id.js';

/** Re-exported for the modules that still import it from here; it lives in protocol/. */
export type { WorkerMode };

/**
 * The registry the frontend routes from. Workers register one record each; the frontend lists then
 * watches. Backends: in-process (memory:), one machine (file:), a cluster (etcd:).
 */

export interface DiscoveryOptions {
  /** Lease TTL for registrations this process makes. */
  leaseTtlMs?: number | undefined;
}


export interface WorkerRecord {
  worker_id: string;
  model: string;
  mode: WorkerMode;
  request_url: string;
  system_url: string;
  /** What the worker's engine can honour; absent in records of workers older than capabilities (they declare none). */
  capabilities?: EngineCapabilities | undefined;
  /** The engine kind (mocker, llama-cpp, openai/vllm...), for operators and error messages. */
  engine?: string | undefined;
}

/**
 * `reset` carries the whole current set: sent first, and again whenever the backend had to
 * resynchronise (after a reconnect), so a watcher never depends on having seen every event.
 */
export type DiscoveryEvent =
  | { type: 'reset'; records: WorkerRecord[] }
  | { type: 'put'; record: WorkerRecord }
  | { type: 'delete'; worker_id: string };

export interface DiscoveryWatch {
  close(): Promise<void>;
}

export interface Discovery {
  /** Human-readable location, for logs. */
  readonly url: string;
  register(record: WorkerRecord): Promise<void>;
  unregister(workerId: string): Promise<void>;
  list(): Promise<WorkerRecord[]>;
  /** Delivers a `reset` with the listed set first, then every change after it. */
  watch(listener: (event: DiscoveryEvent) => void): Promise<DiscoveryWatch>;
  /** Fires when a registration this process holds was lost (lease expired) and must be redone. */
  onRegistrationLost(listener: (workerId: string) => void): () => void;
  /** Drain intents that survive a restart of the worker (etcd); absent for one-machine backends. */
  readonly drainIntents?: DrainIntentStore | undefined;
  close(): Promise<void>;
}

function isHttpUrl(v: unknown): boolean {
  if (typeof v !== 'string') return false;
  try {
    const u = new URL(v);
    return u.protocol === 'http:' || u.protocol === 'https:';
  } catch {
    return false;
  }
}

/**
 * A system URL is an origin (scheme://host[:port]): the admin paths are appended to it, so a path,
 * query or credentials in it would point the frontend's admin reads at some other resource.
 */
function isHttpOrigin(v: unknown): boolean {
  if (!isHttpUrl(v)) return false;
  const u = new URL(v as string);
  return u.pathname === '/' && u.search === '' && u.hash === '' && u.username === '' && u.password === '' && !(v as string).includes('?') && !(v as string).includes('#');
}

/** Records come from other processes (or from whoever can write the registry): check every field. */
export function isWorkerRecord(v: unknown): v is WorkerRecord {
  if (typeof v !== 'object' || v === null) return false;
  const r = v as Record<string, unknown>;
  return (
    isWorkerId(r.worker_id) &&
    typeof r.model === 'string' &&
    r.model !== '' &&
    isWorkerMode(r.mode) &&
    isHttpUrl(r.request_url) &&
    isHttpOrigin(r.system_url) &&
    (r.capabilities === undefined || isCapabilities(r.capabilities)) &&
    (r.engine === undefined || typeof r.engine === 'string')
  );
}
