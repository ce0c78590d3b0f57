import type { Logger } from 'pino';
import { Backoff, pause } from '../common/backoff.js';
import { metadataCall } from './metadata-http.js';
import type { DisruptionSource, Notice } from './notice.js';

/**
 * The Compute Engine metadata server: `instance/preempted` (FALSE, then TRUE once a Spot or
 * preemptible VM is being stopped: about 30 s) and `instance/maintenance-event` (NONE, or
 * MIGRATE_ON_HOST_MAINTENANCE / TERMINATE_ON_HOST_MAINTENANCE 60 s before the event starts; back
 * to NONE when it is over or cancelled). Each key is long-polled (`wait_for_change=true` with the
 * last ETag): the server answers when the value changes, so nothing is polled. A live migration
 * keeps the VM and its streams: it is logged, not drained. Neither key says a time, so a notice's
 * time is when it was seen plus the documented lead. The host is Google's own override,
 * GCE_METADATA_HOST (host[:port]).
 */

export const GCE_HOST_ENV = 'GCE_METADATA_HOST';
const DEFAULT_HOST = 'metadata.google.internal';
/** A Spot or preemptible VM gets about 30 s between `preempted` and its stop. */
export const PREEMPTION_LEAD_MS = 30_000;
/** `maintenance-event` changes 60 s before the event starts. */
export const MAINTENANCE_LEAD_MS = 60_000;
/** The long poll's own bound, asked of the server (timeout_sec); the client waits a little longer. */
const WAIT_S = 60;
const CALL_TIMEOUT_MS = 2000;
const RETRY = { minMs: 500, maxMs: 10_000, jitter: true };

export function gceBase(env: NodeJS.ProcessEnv = process.env): string {
  return `http://${env[GCE_HOST_ENV] || DEFAULT_HOST}/computeMetadata/v1/instance`;
}

export function gcpSource(log: Logger, base = gceBase()): DisruptionSource {
  const stop = new AbortController();
  const loops: Array<Promise<void>> = [];
  /** The value each key holds now, and since when (the notice's time counts from there). */
  const values = new Map<string, { value: string; since: number }>();

  /** Follows one key, calling `changed` after each new value. */
  const follow = async (key: string, changed: () => void): Promise<void> => {
    const signal = stop.signal;
    let etag: string | undefined;
    let failing = false;
    const backoff = new Backoff(RETRY);
    while (!signal.aborted) {
      const wait = etag !== undefined;
      const url = wait ? `${base}/${key}?wait_for_change=true&last_etag=${encodeURIComponent(etag!)}&timeout_sec=${WAIT_S}` : `${base}/${key}`;
      try {
        const res = await metadataCall(url, { headers: { 'metadata-flavor': 'Google' }, timeoutMs: wait ? (WAIT_S + 10) * 1000 : CALL_TIMEOUT_MS, signal });
        if (res.status !== 200 && res.status !== 404) throw new Error(`${key}: HTTP ${res.status}`);
        // Absent (an older metadata server): the key's quiet value.
        const value = res.status === 404 ? '' : res.text.trim();
        if (values.get(key)?.value !== value) {
          values.set(key, { value, since: Date.now() });
          changed();
        }
        if (failing) log.info({ event: 'disruption_source_recovered', source: 'gcp', key }, `gcp ${key} readable again`);
        failing = false;
        backoff.reset();
        const next = res.headers.etag;
        etag = typeof next === 'string' && next !== '' ? next : undefined;
        // No ETag to wait on: read again after a pause rather than spin.
        if (etag === undefined && !(await pause(RETRY.minMs, signal))) return;
      } catch (err) {
        if (signal.aborted) return;
        if (!failing) log.warn({ event: 'disruption_source_failed', source: 'gcp', key, err: (err as Error).message }, `gcp ${key} unreadable (the last value read stands): ${(err as Error).message}`);
        failing = true;
        etag = undefined; // read the value plainly once it answers again
        if (!(await pause(backoff.next(), signal))) return;
      }
    }
  };

  const notices = (): Notice[] => {
    const out: Notice[] = [];
    const preempted = values.get('preempted');
    if (preempted?.value.toUpperCase() === 'TRUE') out.push({ source: 'gcp', id: 'preempted', what: 'instance/preempted TRUE', at: preempted.since + PREEMPTION_LEAD_MS });
    const maintenance = values.get('maintenance-event');
    if (maintenance?.value.startsWith('TERMINATE')) out.push({ source: 'gcp', id: `maintenance-event ${maintenance.value}`, what: `instance/maintenance-event ${maintenance.value}`, at: maintenance.since + MAINTENANCE_LEAD_MS });
    return out;
  };

  return {
    name: 'gcp',
    start(report) {
      if (loops.length > 0) return;
      const changed = () => {
        const m = values.get('maintenance-event')?.value;
        if (m?.startsWith('MIGRATE')) log.info({ event: 'disruption_hint', source: 'gcp', maintenance_event: m }, `gcp maintenance-event ${m}: a live migration keeps this VM, no drain`);
        report(notices());
      };
      loops.push(follow('preempted', changed), follow('maintenance-event', changed));
    },
    async close() {
      stop.abort();
      await Promise.all(loops);
    },
  };
}
