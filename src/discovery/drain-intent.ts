import type { Etcd3 } from 'etcd3';
import { isWorkerRecord, type WorkerRecord } from './worker-record.js';

/** An operator's drain that must outlive the worker process (a restart comes back drained). */
export interface DrainIntent {
  reason: string;
  at: string;
  /** When the intent lapses on its own (ISO 8601); a restart keeps it, never extends it. */
  expires_at?: string | undefined;
  /**
   * The worker's record as it last ran under the intent: a worker that starts drained never
   * registers, and this is how `ebb workers` and `ebb resume` still find it.
   */
  worker?: WorkerRecord | undefined;
}

/** Where a worker keeps its drain intent; only discovery backends shared beyond one process have one. */
export interface DrainIntentStore {
  get(workerId: string): Promise<DrainIntent | undefined>;
  /** Every intent held, by worker id (operators list them: `ebb intents`). */
  list(): Promise<Map<string, DrainIntent>>;
  /** Kept for `ttlMs`, then gone on its own: a forgotten intent must not keep a worker out forever. */
  put(workerId: string, intent: DrainIntent, ttlMs: number): Promise<void>;
  delete(workerId: string): Promise<void>;
}

/** Next to the instance records (`/ebb/v1/instances/`), not under them: frontends watch that prefix. */
export const INTENT_PREFIX = '/ebb/v1/drain-intents/';

const intentKey = (workerId: string) => `${INTENT_PREFIX}${encodeURIComponent(workerId)}`;

/** Values come from whoever can write etcd: read what is valid, and an unreadable value is still an intent (fail-closed). */
function parseIntent(raw: string): DrainIntent {
  try {
    const v = JSON.parse(raw) as Partial<DrainIntent>;
    return {
      reason: typeof v.reason === 'string' ? v.reason : 'drain intent',
      at: typeof v.at === 'string' ? v.at : '',
      expires_at: typeof v.expires_at === 'string' ? v.expires_at : undefined,
      worker: isWorkerRecord(v.worker) ? v.worker : undefined,
    };
  } catch {
    return { reason: 'drain intent (unreadable value)', at: '' };
  }
}

/** etcd: one key per worker id, bound to a lease of its own that is never kept alive (its TTL is the intent's life). */
export class EtcdDrainIntents implements DrainIntentStore {
  constructor(private readonly client: Etcd3) {}

  async get(workerId: string): Promise<DrainIntent | undefined> {
    const raw = await this.client.get(intentKey(workerId)).string();
    return raw === null ? undefined : parseIntent(raw);
  }

  async list(): Promise<Map<string, DrainIntent>> {
    const all = await this.client.getAll().prefix(INTENT_PREFIX).strings();
    return new Map(Object.entries(all).map(([key, raw]) => [decodeURIComponent(key.slice(INTENT_PREFIX.length)), parseIntent(raw)]));
  }

  async put(workerId: string, intent: DrainIntent, ttlMs: number): Promise<void> {
    const lease = this.client.lease(Math.max(1, Math.ceil(ttlMs / 1000)), { autoKeepAlive: false });
    await lease.put(intentKey(workerId)).value(JSON.stringify(intent));
  }

  async delete(workerId: string): Promise<void> {
    await this.client.delete().key(intentKey(workerId));
  }
}
