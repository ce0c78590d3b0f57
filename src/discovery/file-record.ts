import { hostname } from 'node:os';
import { parseAnyRecord, type AnyRecord } from './worker-record.js';

/** One file in the discovery directory: a worker record (serving or loading) plus the lease that keeps it alive. */
export interface FileEntry {
  record: AnyRecord;
  pid: number;
  hostname: string;
  heartbeat_at: number;
  ttl_ms: number;
  /** Set by each register(): a drain+resume quicker than a watcher's scan still reads as a new registration. */
  registered_at?: number;
}

/** A lease shorter than this cannot be kept alive by a timer; longer ones outlive a crash for too long. */
export const MIN_TTL_MS = 100;
export const MAX_TTL_MS = 5 * 60_000;
/** How far ahead of our clock a heartbeat may be (clocks of one machine's processes agree; allow slack). */
export const CLOCK_SKEW_MS = 5_000;

export const HOST = hostname();

const isTime = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v) && v >= 0;

/**
 * The entry a file holds, or undefined when it is not a plausible one: malformed, a TTL outside
 * [MIN_TTL_MS, MAX_TTL_MS], or a heartbeat in the future (which would never expire).
 */
export function parseEntry(text: string, now: number): FileEntry | undefined {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (typeof v !== 'object' || v === null) return undefined;
  const e = v as Record<string, unknown>;
  const plausible =
    parseAnyRecord(e.record) !== undefined &&
    typeof e.pid === 'number' &&
    Number.isSafeInteger(e.pid) &&
    e.pid > 0 &&
    typeof e.hostname === 'string' &&
    isTime(e.heartbeat_at) &&
    e.heartbeat_at <= now + CLOCK_SKEW_MS &&
    typeof e.ttl_ms === 'number' &&
    e.ttl_ms >= MIN_TTL_MS &&
    e.ttl_ms <= MAX_TTL_MS &&
    (e.registered_at === undefined || isTime(e.registered_at));
  return plausible ? (v as FileEntry) : undefined;
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Heartbeat within its TTL, and its owner process alive when it runs on this host. `checkOwner`
 * false skips the process check (a watcher re-reading a heartbeat of an owner it checks each second).
 */
export function entryLive(e: Pick<FileEntry, 'heartbeat_at' | 'ttl_ms' | 'hostname' | 'pid'>, now: number, checkOwner = true): boolean {
  return now - e.heartbeat_at <= e.ttl_ms && !(checkOwner && e.hostname === HOST && !processAlive(e.pid));
}

const identities = new WeakMap<FileEntry, string>();

/** What makes a registration new to a watcher: its content or a fresh register() call, never a heartbeat. Computed once per entry. */
export function identity(e: FileEntry): string {
  let id = identities.get(e);
  if (id === undefined) identities.set(e, (id = `${e.registered_at}|${JSON.stringify(e.record)}`));
  return id;
}
