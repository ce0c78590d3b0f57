import type { Logger } from 'pino';
import { metadataCall, parseTime } from './metadata-http.js';
import { FirstSeen, type DisruptionSource, type Notice } from './notice.js';
import { NoticePoller } from './poller.js';

/**
 * EC2 instance metadata (IMDSv2): a session token (PUT /latest/api/token), then every poll
 * `spot/instance-action` (404 until a Spot interruption is scheduled, then {"action", "time"} two
 * minutes ahead; hibernation starts at once) and `events/maintenance/scheduled` (a JSON list of the
 * instance's scheduled events: Code, NotBefore, State "active"; a cancelled or completed one moves
 * to events/maintenance/history, so it leaves the list: a withdrawal). The endpoint is the AWS SDKs'
 * own override, AWS_EC2_METADATA_SERVICE_ENDPOINT.
 */

export const AWS_ENDPOINT_ENV = 'AWS_EC2_METADATA_SERVICE_ENDPOINT';
const DEFAULT_ENDPOINT = 'http://169.254.169.254';
const TOKEN_TTL_S = 21600;
/** A token this close to its end is renewed first. */
const TOKEN_RENEW_MS = 60_000;
const CALL_TIMEOUT_MS = 2000;

export function awsEndpoint(env: NodeJS.ProcessEnv = process.env): string {
  return (env[AWS_ENDPOINT_ENV] || DEFAULT_ENDPOINT).replace(/\/+$/, '');
}

interface ScheduledEvent {
  Code?: unknown;
  Description?: unknown;
  EventId?: unknown;
  NotBefore?: unknown;
  State?: unknown;
}

export function awsSource(pollMs: number, log: Logger, endpoint = awsEndpoint()): DisruptionSource {
  let token: { value: string; until: number } | undefined;
  const firstSeen = new FirstSeen();

  const getToken = async (signal: AbortSignal): Promise<string> => {
    if (token !== undefined && token.until - Date.now() > TOKEN_RENEW_MS) return token.value;
    const res = await metadataCall(`${endpoint}/latest/api/token`, { method: 'PUT', headers: { 'x-aws-ec2-metadata-token-ttl-seconds': String(TOKEN_TTL_S) }, timeoutMs: CALL_TIMEOUT_MS, signal });
    if (res.status !== 200 || res.text === '') throw new Error(`IMDSv2 token: HTTP ${res.status}`);
    token = { value: res.text, until: Date.now() + TOKEN_TTL_S * 1000 };
    return token.value;
  };

  /** One metadata item: its text, or undefined when the instance has none (404). */
  const item = async (path: string, signal: AbortSignal): Promise<string | undefined> => {
    const res = await metadataCall(`${endpoint}/latest/meta-data/${path}`, { headers: { 'x-aws-ec2-metadata-token': await getToken(signal) }, timeoutMs: CALL_TIMEOUT_MS, signal });
    if (res.status === 404) return undefined;
    if (res.status === 401) token = undefined; // expired or revoked: a new one next time
    if (res.status !== 200) throw new Error(`${path}: HTTP ${res.status}`);
    return res.text;
  };

  const read = async (signal: AbortSignal): Promise<Notice[]> => {
    const notices: Notice[] = [];
    firstSeen.begin();
    const action = await item('spot/instance-action', signal);
    if (action !== undefined) {
      // Announced, whatever its shape: a time that cannot be read is taken as now (fail closed).
      let v: { action?: unknown; time?: unknown } = {};
      try {
        v = JSON.parse(action) as typeof v;
      } catch {
        log.warn({ event: 'disruption_unreadable', source: 'aws', body: action.slice(0, 200) }, 'spot/instance-action is not JSON: taken as an interruption now');
      }
      const what = typeof v.action === 'string' ? v.action : 'unknown action';
      const id = `spot/instance-action ${what}`;
      notices.push({ source: 'aws', id, what: `spot instance-action ${what}`, at: parseTime(v.time) ?? firstSeen.at(id) });
    }
    const scheduled = await item('events/maintenance/scheduled', signal);
    if (scheduled !== undefined && scheduled.trim() !== '') {
      const events = JSON.parse(scheduled) as unknown;
      if (!Array.isArray(events)) throw new Error('events/maintenance/scheduled is not a JSON list');
      for (const e of events as ScheduledEvent[]) {
        if (typeof e !== 'object' || e === null || (e.State !== undefined && e.State !== 'active')) continue;
        const id = typeof e.EventId === 'string' ? e.EventId : `${String(e.Code)}@${String(e.NotBefore)}`;
        const description = typeof e.Description === 'string' ? ` (${e.Description})` : '';
        notices.push({ source: 'aws', id: `maintenance ${id}`, what: `scheduled maintenance ${String(e.Code)}${description}`, at: parseTime(e.NotBefore) ?? firstSeen.at(`maintenance ${id}`) });
      }
    }
    return notices;
  };

  return new NoticePoller('aws', read, pollMs, log);
}
