import { EventEmitter } from 'node:events';
import type { Discovery, DiscoveryEvent, DiscoveryWatch, WorkerRecord } from './discovery.js';
import { callListener } from './guards.js';
import { MemoryScaleDownLocks } from './scale-down-lock.js';
import { MemoryRouteMarks } from './route-marks.js';

/** In-process discovery: for tests and for components sharing one process. Nothing expires. */
export class MemoryDiscovery implements Discovery {
  readonly url = 'memory:';
  readonly scaleDownLocks = new MemoryScaleDownLocks();
  readonly routeMarks = new MemoryRouteMarks();
  private readonly records = new Map<string, WorkerRecord>();
  private readonly events = new EventEmitter();

  async register(record: WorkerRecord): Promise<void> {
    this.records.set(record.worker_id, { ...record });
    this.events.emit('event', { type: 'put', record: { ...record } } satisfies DiscoveryEvent);
  }

  async unregister(workerId: string): Promise<void> {
    if (this.records.delete(workerId)) this.events.emit('event', { type: 'delete', worker_id: workerId } satisfies DiscoveryEvent);
  }

  async list(): Promise<WorkerRecord[]> {
    return [...this.records.values()].map((r) => ({ ...r }));
  }

  async watch(listener: (event: DiscoveryEvent) => void): Promise<DiscoveryWatch> {
    // A throwing listener must neither fail the register() that emitted nor starve the other watchers.
    const guarded = (event: DiscoveryEvent) => callListener('watch', listener, event);
    guarded({ type: 'reset', records: await this.list() });
    this.events.on('event', guarded);
    return { close: async () => void this.events.off('event', guarded) };
  }

  onRegistrationLost(): () => void {
    return () => undefined;
  }

  async close(): Promise<void> {
    this.events.removeAllListeners();
    await this.routeMarks.close();
  }
}
