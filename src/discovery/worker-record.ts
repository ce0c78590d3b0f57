import { isCapabilities, type EngineCapabilities } from '../protocol/capabilities.js';
import { isWorkerMode, type WorkerMode } from '../protocol/worker-mode.js';
import type { KvCacheDeclaration } from '../protocol/kv-events.js';
import { isWorkerId } from './worker-id.js';
import { isAdapterRecord, type AdapterRecord } from '../protocol/adapters.js';

/** What a worker registers in discovery: one record each. */
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
  /** The engine's prefix cache, where it has one the frontend can route by (issue 23). */
  kv_cache?: KvCacheDeclaration | undefined;
  /** The LoRA adapters it can load and those resident (issue 37); absent: it serves its base model only. */
  adapters?: AdapterRecord | undefined;
}

const TOKENIZER_KINDS = new Set(['mocker-words', 'worker']);
const KV_EVENT_KINDS = new Set(['exact', 'none']);

function isKvCacheDeclaration(v: unknown): v is KvCacheDeclaration {
  if (typeof v !== 'object' || v === null) return false;
  const d = v as Record<string, unknown>;
  return Number.isSafeInteger(d.block_size) && (d.block_size as number) >= 1 && (d.block_size as number) <= 1 << 16 && TOKENIZER_KINDS.has(d.tokenizer as string) && KV_EVENT_KINDS.has(d.events as string);
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

/**
 * What a worker registers while its engine loads, under the key its serving record then replaces:
 * the frontends learn that its model is coming, and its requests wait in the admission queue for it
 * instead of failing. It has no request_url (nothing may be sent to it yet), so a reader older than
 * it, which requires one, reads the key as no record at all.
 */
export interface LoadingRecord {
  worker_id: string;
  model: string;
  mode: WorkerMode;
  system_url: string;
  engine?: string | undefined;
  /** When it started loading (ISO 8601). */
  loading: { since: string };
}

/** A record under a worker's key: serving (routable), or loading. */
export type AnyRecord = WorkerRecord | LoadingRecord;

export function isLoadingRecord(v: unknown): v is LoadingRecord {
  if (typeof v !== 'object' || v === null) return false;
  const r = v as Record<string, unknown>;
  const loading = r.loading as Record<string, unknown> | undefined;
  return (
    r.request_url === undefined &&
    typeof loading === 'object' &&
    loading !== null &&
    typeof loading.since === 'string' &&
    isWorkerId(r.worker_id) &&
    typeof r.model === 'string' &&
    r.model !== '' &&
    isWorkerMode(r.mode) &&
    isHttpOrigin(r.system_url) &&
    (r.engine === undefined || typeof r.engine === 'string')
  );
}

/** A serving or a loading record, checked; undefined for anything else. */
export function parseAnyRecord(v: unknown): AnyRecord | undefined {
  return isWorkerRecord(v) || isLoadingRecord(v) ? v : undefined;
}

/** Told apart by the request URL: only a serving record has one. */
export const isLoading = (r: AnyRecord): r is LoadingRecord => (r as Partial<WorkerRecord>).request_url === undefined;

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
    (r.engine === undefined || typeof r.engine === 'string') &&
    (r.kv_cache === undefined || isKvCacheDeclaration(r.kv_cache)) &&
    (r.adapters === undefined || isAdapterRecord(r.adapters))
  );
}
