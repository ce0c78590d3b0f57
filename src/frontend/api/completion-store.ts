import { EbbError } from '../../protocol/errors.js';

/**
 * Stored chat completions (`store: true`): what GET, POST and DELETE /v1/chat/completions/{id}, the
 * list (GET /v1/chat/completions) and /messages read. Each is its tenant's: another tenant's id is
 * one never heard of (404). Kept in this frontend's memory, or (a fleet) in its shared store, so any
 * frontend answers for it (completion-store-redis.ts).
 */
export interface StoredCompletion {
  id: string;
  tenant: string;
  /** The chat.completion object as it was answered, with the request's `metadata` (its only field that changes). */
  completion: Record<string, unknown> & { id: string; model: string; metadata: Record<string, string> };
  /** The request's messages, as they were sent. */
  messages: unknown[];
  /** When it was stored (ms): the list's order. */
  at: number;
}

/** What a list asks for (OpenAI's query: after, limit, order, model, metadata). */
export interface ListQuery {
  after?: string | undefined;
  limit: number;
  order: 'asc' | 'desc';
  model?: string | undefined;
  metadata?: Record<string, string> | undefined;
}

export interface Page<T> {
  data: T[];
  hasMore: boolean;
}

export interface CompletionStore {
  /** Keeps `c` (resolves once any frontend of the fleet can read it). */
  put(c: StoredCompletion): Promise<void>;
  /** `tenant`'s completion `id`, or the 404. */
  get(id: string, tenant: string): Promise<StoredCompletion>;
  /** Replaces its metadata; the completion as it now is. */
  setMetadata(id: string, tenant: string, metadata: Record<string, string>): Promise<StoredCompletion>;
  /** Forgets it (the 404 when there is none). */
  delete(id: string, tenant: string): Promise<void>;
  list(tenant: string, q: ListQuery): Promise<Page<StoredCompletion>>;
}

export const notStored = (id: string) => new EbbError('response_not_found', `no chat completion ${id} is stored (made without store: true, deleted, expired, or another key's)`);

export const unknownCursor = (after: string) => new EbbError('invalid_request', `after: no stored chat completion ${after} to list after`, { param: 'after' });

/** Whether `c` passes a list's filters: its model, and every metadata pair asked for. */
export function matches(c: StoredCompletion, q: Pick<ListQuery, 'model' | 'metadata'>): boolean {
  if (q.model !== undefined && c.completion.model !== q.model) return false;
  for (const [k, v] of Object.entries(q.metadata ?? {})) if (c.completion.metadata[k] !== v) return false;
  return true;
}

export interface MemoryCompletionStoreOptions {
  /** How long a completion stays stored (--response-ttl-ms, as Responses). */
  ttlMs: number;
  maxRecords: number;
  /** All stored completions at most this many bytes (the oldest forgotten first). */
  maxBytes: number;
}

/** This frontend's stored completions, oldest first (insertion order), bounded in age, count and bytes. */
export class MemoryCompletionStore implements CompletionStore {
  private readonly stored = new Map<string, { c: StoredCompletion; bytes: number }>();
  private bytes = 0;

  constructor(private readonly opts: MemoryCompletionStoreOptions) {}

  get size(): number {
    return this.stored.size;
  }

  get keptBytes(): number {
    return this.bytes;
  }

  put(c: StoredCompletion): Promise<void> {
    const bytes = JSON.stringify(c).length;
    this.stored.set(c.id, { c, bytes });
    this.bytes += bytes;
    this.bound();
    return Promise.resolve();
  }

  get(id: string, tenant: string): Promise<StoredCompletion> {
    return Promise.resolve(this.find(id, tenant));
  }

  setMetadata(id: string, tenant: string, metadata: Record<string, string>): Promise<StoredCompletion> {
    const c = this.find(id, tenant);
    c.completion = { ...c.completion, metadata };
    return Promise.resolve(c);
  }

  delete(id: string, tenant: string): Promise<void> {
    this.find(id, tenant);
    this.forget(id);
    return Promise.resolve();
  }

  list(tenant: string, q: ListQuery): Promise<Page<StoredCompletion>> {
    this.expire();
    const all = [...this.stored.values()].map((s) => s.c).filter((c) => c.tenant === tenant);
    if (q.order === 'desc') all.reverse();
    let from = 0;
    if (q.after !== undefined) {
      from = all.findIndex((c) => c.id === q.after) + 1;
      if (from === 0) throw unknownCursor(q.after);
    }
    const data: StoredCompletion[] = [];
    for (let i = from; i < all.length; i++) {
      if (!matches(all[i]!, q)) continue;
      if (data.length === q.limit) return Promise.resolve({ data, hasMore: true });
      data.push(all[i]!);
    }
    return Promise.resolve({ data, hasMore: false });
  }

  private find(id: string, tenant: string): StoredCompletion {
    this.expire();
    const s = this.stored.get(id);
    if (s === undefined || s.c.tenant !== tenant) throw notStored(id);
    return s.c;
  }

  private forget(id: string): void {
    const s = this.stored.get(id);
    if (s === undefined) return;
    this.stored.delete(id);
    this.bytes -= s.bytes;
  }

  /** Past their age first (the oldest are first), then past a bound, oldest first. */
  private expire(now = Date.now()): void {
    for (const { c } of this.stored.values()) {
      if (now - c.at <= this.opts.ttlMs) break;
      this.forget(c.id);
    }
  }

  private bound(): void {
    this.expire();
    for (const { c } of this.stored.values()) {
      if (this.stored.size <= this.opts.maxRecords && this.bytes <= this.opts.maxBytes) return;
      this.forget(c.id);
    }
  }
}
