import type { Etcd3 } from 'etcd3';

/** An operator's drain that must outlive the worker process (a restart comes back drained). */
export interface DrainIntent {
  reason: string;
  at: string;
}

/** Where a worker keeps its drain intent; only discovery backends shared beyond one process have one. */
export interface DrainIntentStore {
  get(workerId: string): Promise<DrainIntent | undefined>;
  /** Kept for `ttlMs`, then gone on its own: a forgotten intent must not keep a worker out forever. */
  put(workerId: string, intent: DrainIntent, ttlMs: number): Promise<void>;
  delete(workerId: string): Promise<void>;
}

/** Next to the instance records (`/ebb/v1/instances/`), not under them: frontends watch that prefix. */
export const INTENT_PREFIX = '/ebb/v1/drain-intents/';

const intentKey = (workerId: string) => `${INTENT_PREFIX}${encodeURIComponent(workerId)}`;

/** etcd: one key per worker id, bound to a lease of its own that is never kept alive (its TTL is the intent's life). */
export class EtcdDrainIntents implements DrainIntentStore {
  constructor(private readonly client: Etcd3) {}

  async get(workerId: string): Promise<DrainIntent | undefined> {
    const raw = await this.client.get(intentKey(workerId)).string();
    if (raw === null) return undefined;
    try {
      const v = JSON.parse(raw) as Partial<DrainIntent>;
      return { reason: typeof v.reason === 'string' ? v.reason : 'drain intent', at: typeof v.at === 'string' ? v.at : '' };
    } catch {
      return { reason: 'drain intent (unreadable value)', at: '' }; // fail-closed: an intent is there
    }
  }

  async put(workerId: string, intent: DrainIntent, ttlMs: number): Promise<void> {
    const lease = this.client.lease(Math.max(1, Math.ceil(ttlMs / 1000)), { autoKeepAlive: false });
    await lease.put(intentKey(workerId)).value(JSON.stringify(intent));
  }

  async delete(workerId: string): Promise<void> {
    await this.client.delete().key(intentKey(workerId));
  }
}
