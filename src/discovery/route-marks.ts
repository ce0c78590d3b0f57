import { EventEmitter } from 'node:events';
import { isWorkerId } from './worker-id.js';

/**
 * Which workers each frontend routes to, marked by the frontends themselves in discovery: a
 * worker counts as ready for a rollout (its /ready, `ebb rollout`'s next step, a Deployment's
 * progress) only once every live frontend marks it, so an old worker is never stopped while some
 * frontend could not route to its replacement yet. Each frontend holds one mark, kept alive as a
 * lease (a frontend that is gone stops counting), rewritten whenever its routing view changes.
 */
export interface RouteMark {
  frontend_id: string;
  /** The workers in its routing view when it wrote this (those it may send a request to). */
  workers: string[];
}

export interface RouteMarks {
  /** Writes (or replaces) this frontend's mark, kept alive until withdraw() or this process goes. */
  publish(mark: RouteMark): Promise<void>;
  /** Removes it (a frontend that closes is no longer waited for). Idempotent. */
  withdraw(frontendId: string): Promise<void>;
  /** Every live frontend's mark. */
  list(): Promise<RouteMark[]>;
  /** Calls `changed` whenever a mark may have changed (written, removed, expired); list() reads them. */
  watch(changed: () => void): Promise<{ close(): Promise<void> }>;
  close(): Promise<void>;
}

/** A frontend id as written: the same rules as a worker id (it names a key or a file). */
export const isFrontendId = isWorkerId;

/** Marks come from whoever can write discovery: only well-formed ones count. */
export function parseRouteMark(v: unknown): RouteMark | undefined {
  if (typeof v !== 'object' || v === null) return undefined;
  const m = v as Record<string, unknown>;
  if (!isFrontendId(m.frontend_id) || !Array.isArray(m.workers) || !m.workers.every((w) => typeof w === 'string')) return undefined;
  return { frontend_id: m.frontend_id, workers: m.workers as string[] };
}

/** In one process (memory: discovery): nothing expires, a change is told at once. */
export class MemoryRouteMarks implements RouteMarks {
  private readonly marks = new Map<string, RouteMark>();
  private readonly events = new EventEmitter();

  async publish(mark: RouteMark): Promise<void> {
    this.marks.set(mark.frontend_id, { frontend_id: mark.frontend_id, workers: [...mark.workers] });
    this.events.emit('changed');
  }

  async withdraw(frontendId: string): Promise<void> {
    if (this.marks.delete(frontendId)) this.events.emit('changed');
  }

  async list(): Promise<RouteMark[]> {
    return [...this.marks.values()].map((m) => ({ frontend_id: m.frontend_id, workers: [...m.workers] }));
  }

  async watch(changed: () => void): Promise<{ close(): Promise<void> }> {
    this.events.on('changed', changed);
    return { close: async () => void this.events.off('changed', changed) };
  }

  async close(): Promise<void> {
    this.events.removeAllListeners();
  }
}
