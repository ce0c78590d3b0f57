import type { Static } from 'typebox';
import { Type } from './schema.js';

/**
 * LoRA adapters on the wire (issue 37): a worker's adapter states (lifecycle/adapter-states.ts),
 * its discovery record's `adapters`, and the Admin API's adapter routes.
 */

export const ADAPTER_STATES = ['loading', 'serving', 'draining', 'unloaded'] as const;
export type AdapterState = (typeof ADAPTER_STATES)[number];

/** An adapter's state as the discovery record holds it: only those that occupy a slot. */
export type ResidentState = Exclude<AdapterState, 'unloaded'>;
/** The states that hold one of the engine's adapter slots (lifecycle/adapter-states.ts: SLOT_STATES). */
export const RESIDENT_STATES: ReadonlySet<AdapterState> = new Set<ResidentState>(['loading', 'serving', 'draining']);

/**
 * A worker's adapters in its discovery record: small, and written only when one changes state
 * (a load, a drain, an unload), never per request.
 */
export interface AdapterRecord {
  /** Adapters resident at once, at most. */
  slots: number;
  /** A typical load, in ms: what the router weighs a load elsewhere by. */
  load_ms: number;
  /** Every adapter the worker can load (those resident too). */
  available: string[];
  /** Those that occupy a slot now, by state. */
  resident: Record<string, ResidentState>;
}

/** Adapter names are client `model` names: printable, no slashes' worth of path tricks in admin URLs. */
export const ADAPTER_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$/;

export function isAdapterName(v: unknown): v is string {
  return typeof v === 'string' && ADAPTER_NAME_PATTERN.test(v);
}

/** Records come from other processes: checked field by field. */
export function isAdapterRecord(v: unknown): v is AdapterRecord {
  if (typeof v !== 'object' || v === null) return false;
  const r = v as Record<string, unknown>;
  if (!Number.isSafeInteger(r.slots) || (r.slots as number) < 0) return false;
  if (typeof r.load_ms !== 'number' || !Number.isFinite(r.load_ms) || r.load_ms < 0) return false;
  if (!Array.isArray(r.available) || r.available.length > 10_000 || !r.available.every(isAdapterName)) return false;
  if (typeof r.resident !== 'object' || r.resident === null || Array.isArray(r.resident)) return false;
  return Object.entries(r.resident as Record<string, unknown>).every(([name, state]) => isAdapterName(name) && RESIDENT_STATES.has(state as AdapterState));
}

/** One adapter in GET /engine/status's `adapters`, and the answer of the adapter routes. */
export interface AdapterStatus {
  name: string;
  state: AdapterState;
  inflight_requests: number;
  /** Loads of it since the worker started. */
  loads: number;
  /** What a drain of it waits for (empty unless draining). */
  waiting_for: string[];
  last_used: string | null;
  state_since: string;
}

/** POST /engine/adapters/{name}/load: engines that read files take the adapter's path. */
export const AdapterLoadBodySchema = Type.Object({ path: Type.Optional(Type.String({ minLength: 1, maxLength: 4096 })) }, { additionalProperties: false });
export type AdapterLoadBody = Static<typeof AdapterLoadBodySchema>;

/** POST /engine/adapters/{name}/drain (and /unload): why, for the log. */
export const AdapterDrainBodySchema = Type.Object({ reason: Type.Optional(Type.String({ maxLength: 500 })) }, { additionalProperties: false });
export type AdapterDrainBody = Static<typeof AdapterDrainBodySchema>;
