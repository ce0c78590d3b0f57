import { EventEmitter } from 'node:events';
import { isLoading, type AnyRecord, type Discovery, type DiscoveryEvent, type DiscoveryWatch, type FleetEvent, type LoadingRecord, type WorkerRecord } from './discovery.js';
import { callListener } from './guards.js';
import { MemoryScaleDownLocks } from './scale-down-lock.js';
import { MemoryRouteMarks } from './route-marks.js';
import { servingOnly } from './serving-only.js';

/** In-process discovery: for tests and for components sharing one process. Nothing expires. */
export class MemoryDiscovery implements Discovery {
  readonly url = 'memory:';
  readonly scaleDownLocks = new MemoryScaleDownLocks();
  readonly routeMarks = new MemoryRouteMarks();
  private readonly records = new Map<string, AnyRecord>();
  private readonly events = new EventEmitter();

  async register(record: AnyRecord): Promise<void> {
    this.records.set(record.worker_id, { ...record });
    const event: FleetEvent = isLoading(record) ? { type: 'loading', record: { ...record } } : { type: 'put', record: { ...record } };
    this.events.emit('event', event);
  }

  async unregister(workerId: string): Promise<void> {
    if (this.records.delete(workerId)) this.events.emit('event', { type: 'delete', worker_id: workerId } satisfies FleetEvent);
  }

  async list(): Promise<WorkerRecord[]> {
    return [...this.records.values()].flatMap((r) => (isLoading(r) ? [] : [{ ...r }]));
  }

  async watch(listener: (event: DiscoveryEvent) => void): Promise<DiscoveryWatch> {
    return this.watchAll(servingOnly(listener));
  }

  async watchAll(listener: (event: FleetEvent) => void): Promise<DiscoveryWatch> {
    // A throwing listener must neither fail the register() that emitted nor starve the other watchers.
    const guarded = (event: FleetEvent) => callListener('watch', listener, event);
    const loading: LoadingRecord[] = [];
    for (const r of this.records.values()) if (isLoading(r)) loading.push({ ...r });
    guarded({ type: 'reset', records: await this.list(), loading });
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
