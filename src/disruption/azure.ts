import type { Logger } from 'pino';
import { metadataCall, parseTime } from './metadata-http.js';
import { FirstSeen, type DisruptionSource, type Notice } from './notice.js';
import { NoticePoller } from './poller.js';

/**
 * Azure Scheduled Events (GET /metadata/scheduledevents, `Metadata: true`): the events of the VM's
 * availability set or scale set, each naming the VMs it affects (Resources). Preempt (a Spot
 * eviction, at least 30 s ahead), Terminate, Reboot and Redeploy take the VM away at NotBefore (an
 * RFC 1123 date; empty once Started); Freeze pauses it for seconds and keeps it, so it is not a
 * notice. An event that leaves the list before it started was cancelled: a withdrawal. Only this
 * VM's events count: its name is read from the instance metadata (until it is known, every event
 * counts: fail closed). Azure's endpoint has no override of its own; EBB_AZURE_METADATA_ENDPOINT
 * sets one (tests).
 */

export const AZURE_ENDPOINT_ENV = 'EBB_AZURE_METADATA_ENDPOINT';
const DEFAULT_ENDPOINT = 'http://169.254.169.254';
const EVENTS_API = '2020-07-01';
const INSTANCE_API = '2021-02-01';
const CALL_TIMEOUT_MS = 2000;
/** Event types that take the VM away (Freeze does not). */
const REMOVING = new Set(['Preempt', 'Terminate', 'Reboot', 'Redeploy']);

export function azureEndpoint(env: NodeJS.ProcessEnv = process.env): string {
  return (env[AZURE_ENDPOINT_ENV] || DEFAULT_ENDPOINT).replace(/\/+$/, '');
}

interface ScheduledEvent {
  EventId?: unknown;
  EventType?: unknown;
  EventStatus?: unknown;
  Resources?: unknown;
  NotBefore?: unknown;
}

export function azureSource(pollMs: number, log: Logger, endpoint = azureEndpoint()): DisruptionSource {
  const headers = { metadata: 'true' };
  let vmName: string | undefined;
  const firstSeen = new FirstSeen();

  const ownName = async (signal: AbortSignal): Promise<string | undefined> => {
    if (vmName !== undefined) return vmName;
    try {
      const res = await metadataCall(`${endpoint}/metadata/instance/compute/name?api-version=${INSTANCE_API}&format=text`, { headers, timeoutMs: CALL_TIMEOUT_MS, signal });
      if (res.status === 200 && res.text.trim() !== '') vmName = res.text.trim();
    } catch {
      // Asked again next poll; meanwhile every event counts.
    }
    return vmName;
  };

  const read = async (signal: AbortSignal): Promise<Notice[]> => {
    const name = await ownName(signal);
    const res = await metadataCall(`${endpoint}/metadata/scheduledevents?api-version=${EVENTS_API}`, { headers, timeoutMs: CALL_TIMEOUT_MS, signal });
    if (res.status !== 200) throw new Error(`scheduledevents: HTTP ${res.status}`);
    const doc = JSON.parse(res.text) as { Events?: unknown };
    if (!Array.isArray(doc.Events)) throw new Error('scheduledevents: no Events list');
    const notices: Notice[] = [];
    firstSeen.begin();
    for (const e of doc.Events as ScheduledEvent[]) {
      if (typeof e !== 'object' || e === null || typeof e.EventType !== 'string' || !REMOVING.has(e.EventType)) continue;
      const resources = Array.isArray(e.Resources) ? (e.Resources as unknown[]) : [];
      if (name !== undefined && resources.length > 0 && !resources.includes(name)) continue;
      const id = typeof e.EventId === 'string' ? e.EventId : `${e.EventType}@${String(e.NotBefore)}`;
      // Started (NotBefore empty): it is happening now.
      const key = `scheduled event ${id}`;
      notices.push({ source: 'azure', id: key, what: `scheduled event ${e.EventType} (${String(e.EventStatus ?? 'Scheduled')})`, at: parseTime(e.NotBefore) ?? firstSeen.at(key) });
    }
    return notices;
  };

  return new NoticePoller('azure', read, pollMs, log);
}
