import type { WorkerRecord } from '../../discovery/discovery.js';
import type { ResidentState } from '../../protocol/adapters.js';

/** A worker's adapters as routing reads them, from its discovery record. */
export interface AdapterView {
  available: ReadonlySet<string>;
  resident: ReadonlyMap<string, ResidentState>;
  /** Slots not taken: a load there needs no eviction. */
  free: number;
  loadMs: number;
}

const NONE: AdapterView = { available: new Set(), resident: new Map(), free: 0, loadMs: 0 };

/** Records are immutable once received (a change is a new record): each is read once, not per decision. */
const views = new WeakMap<WorkerRecord, AdapterView>();

export function adapterView(record: WorkerRecord): AdapterView {
  const a = record.adapters;
  if (a === undefined) return NONE;
  let v = views.get(record);
  if (v !== undefined) return v;
  const resident = new Map(Object.entries(a.resident));
  v = { available: new Set(a.available), resident, free: Math.max(0, a.slots - resident.size), loadMs: a.load_ms };
  views.set(record, v);
  return v;
}

/** The worker can take a request for `adapter`: it can load it, and it is not draining it there. */
export function canServeAdapter(record: WorkerRecord, adapter: string): boolean {
  const v = adapterView(record);
  return v.available.has(adapter) && v.resident.get(adapter) !== 'draining';
}
