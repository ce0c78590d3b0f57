/**
 * In-test cloud metadata endpoints, each answering as its provider documents it, over real HTTP
 * on a loopback port (the real ones, link-local, are not reachable here):
 *
 * - AWS EC2 instance metadata, IMDSv2 only: PUT /latest/api/token with
 *   X-aws-ec2-metadata-token-ttl-seconds (1..21600) answers a token; a GET without a valid
 *   X-aws-ec2-metadata-token is 401. /latest/meta-data/spot/instance-action is 404 until an
 *   interruption is announced, then {"action", "time"}; /latest/meta-data/events/maintenance/scheduled
 *   lists the active scheduled events (Code, Description, EventId, NotBefore and NotAfter as
 *   "21 Jan 2019 09:00:43 GMT", State "active"); a cancelled one moves to .../history, State "canceled".
 * - Compute Engine metadata: /computeMetadata/v1/instance/{preempted,maintenance-event} need
 *   Metadata-Flavor: Google (403 without) and answer it back with an ETag; with
 *   ?wait_for_change=true&last_etag=E the answer waits until the value's ETag differs from E (or
 *   timeout_sec passes, then the unchanged value).
 * - Azure instance metadata: every path needs `Metadata: true` (400 without) and an api-version;
 *   /metadata/instance/compute/name?format=text is the VM's name; /metadata/scheduledevents is
 *   {"DocumentIncarnation", "Events": [...]}, the incarnation bumped by every change.
 */
import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

abstract class FakeEndpoint {
  url = '';
  /** Every request: method and path with its query. */
  readonly requests: Array<{ method: string; path: string }> = [];
  private server: Server | undefined;

  async start(): Promise<string> {
    this.server = createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        this.requests.push({ method: req.method ?? '', path: req.url ?? '' });
        this.handle(req, new URL(req.url ?? '/', 'http://x'), res);
      });
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this.url;
  }

  async close(): Promise<void> {
    this.server?.closeAllConnections();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }

  protected abstract handle(req: IncomingMessage, url: URL, res: ServerResponse): void;

  protected static text(res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}): void {
    res.writeHead(status, { 'content-type': 'text/plain', ...headers });
    res.end(body);
  }
}

/** "21 Jan 2019 09:00:43 GMT", as IMDS writes a scheduled event's times. */
export function imdsTime(ms: number): string {
  const d = new Date(ms);
  const [, day, mon, year, time] = d.toUTCString().split(' ') as [string, string, string, string, string];
  return `${day} ${mon} ${year} ${time} GMT`;
}

export interface ImdsEvent {
  Code: string;
  Description: string;
  EventId: string;
  NotBefore: string;
  NotAfter: string;
  State: 'active' | 'canceled' | 'completed';
}

export class FakeImds extends FakeEndpoint {
  private readonly tokens = new Map<string, number>();
  private instanceAction: { action: string; time: string } | undefined;
  private scheduled: ImdsEvent[] = [];
  private history: ImdsEvent[] = [];

  /** Two minutes ahead in real life; `at` here. */
  announceSpotInterruption(at: number, action: 'terminate' | 'stop' | 'hibernate' = 'terminate'): void {
    this.instanceAction = { action, time: new Date(at).toISOString().replace(/\.\d{3}Z$/, 'Z') };
  }

  scheduleMaintenance(id: string, code: string, notBefore: number, durationMs = 15 * 60_000): void {
    this.scheduled.push({ Code: code, Description: `scheduled ${code}`, EventId: id, NotBefore: imdsTime(notBefore), NotAfter: imdsTime(notBefore + durationMs), State: 'active' });
  }

  cancelMaintenance(id: string): void {
    const e = this.scheduled.find((x) => x.EventId === id);
    if (!e) throw new Error(`no scheduled event ${id}`);
    this.scheduled = this.scheduled.filter((x) => x !== e);
    this.history.push({ ...e, Description: `[Canceled] ${e.Description}`, State: 'canceled' });
  }

  get tokenRequests(): number {
    return this.requests.filter((r) => r.method === 'PUT' && r.path === '/latest/api/token').length;
  }

  protected handle(req: IncomingMessage, url: URL, res: ServerResponse): void {
    if (url.pathname === '/latest/api/token') {
      if (req.method !== 'PUT') return FakeEndpoint.text(res, 405, 'Method Not Allowed');
      const ttl = Number(req.headers['x-aws-ec2-metadata-token-ttl-seconds']);
      if (!Number.isInteger(ttl) || ttl < 1 || ttl > 21600) return FakeEndpoint.text(res, 400, 'Bad Request');
      const token = `tok-${Math.random().toString(36).slice(2)}`;
      this.tokens.set(token, Date.now() + ttl * 1000);
      return FakeEndpoint.text(res, 200, token, { 'x-aws-ec2-metadata-token-ttl-seconds': String(ttl) });
    }
    const token = req.headers['x-aws-ec2-metadata-token'];
    const until = typeof token === 'string' ? this.tokens.get(token) : undefined;
    if (until === undefined || until < Date.now()) return FakeEndpoint.text(res, 401, 'Unauthorized');
    if (req.method !== 'GET') return FakeEndpoint.text(res, 405, 'Method Not Allowed');
    switch (url.pathname) {
      case '/latest/meta-data/spot/instance-action':
        return this.instanceAction ? FakeEndpoint.text(res, 200, JSON.stringify(this.instanceAction)) : FakeEndpoint.text(res, 404, 'Not Found');
      case '/latest/meta-data/events/maintenance/scheduled':
        return FakeEndpoint.text(res, 200, JSON.stringify(this.scheduled, null, 2));
      case '/latest/meta-data/events/maintenance/history':
        return FakeEndpoint.text(res, 200, JSON.stringify(this.history, null, 2));
      default:
        return FakeEndpoint.text(res, 404, 'Not Found');
    }
  }
}

export class FakeGceMetadata extends FakeEndpoint {
  private readonly values = new Map<string, string>([
    ['preempted', 'FALSE'],
    ['maintenance-event', 'NONE'],
  ]);
  private waiters: Array<{ key: string; etag: string; res: ServerResponse; timer: NodeJS.Timeout }> = [];

  /** GCE_METADATA_HOST for this server. */
  get host(): string {
    return this.url.replace(/^http:\/\//, '');
  }

  set(key: 'preempted' | 'maintenance-event', value: string): void {
    this.values.set(key, value);
    const ready = this.waiters.filter((w) => w.key === key && w.etag !== this.etag(key));
    this.waiters = this.waiters.filter((w) => !ready.includes(w));
    for (const w of ready) {
      clearTimeout(w.timer);
      this.answer(w.key, w.res);
    }
  }

  /** Long polls held now (a client waiting for a change). */
  waiting(key: string): number {
    return this.waiters.filter((w) => w.key === key).length;
  }

  private etag(key: string): string {
    return createHash('sha1').update(this.values.get(key) ?? '').digest('hex').slice(0, 16);
  }

  private answer(key: string, res: ServerResponse): void {
    FakeEndpoint.text(res, 200, this.values.get(key) ?? '', { 'metadata-flavor': 'Google', etag: this.etag(key) });
  }

  override async close(): Promise<void> {
    for (const w of this.waiters) clearTimeout(w.timer);
    this.waiters = [];
    await super.close();
  }

  protected handle(req: IncomingMessage, url: URL, res: ServerResponse): void {
    if (req.headers['metadata-flavor'] !== 'Google') return FakeEndpoint.text(res, 403, 'Missing Metadata-Flavor:Google header.');
    const m = /^\/computeMetadata\/v1\/instance\/([\w-]+)$/.exec(url.pathname);
    const key = m?.[1];
    if (key === undefined || !this.values.has(key)) return FakeEndpoint.text(res, 404, 'Not Found');
    const last = url.searchParams.get('last_etag');
    if (url.searchParams.get('wait_for_change') !== 'true' || (last !== null && last !== this.etag(key))) return this.answer(key, res);
    const timeoutS = Number(url.searchParams.get('timeout_sec') ?? '300');
    const w = { key, etag: last ?? this.etag(key), res, timer: setTimeout(() => {
      this.waiters = this.waiters.filter((x) => x !== w);
      this.answer(key, res);
    }, timeoutS * 1000) };
    this.waiters.push(w);
    res.once('close', () => {
      clearTimeout(w.timer);
      this.waiters = this.waiters.filter((x) => x !== w);
    });
  }
}

export interface AzureEvent {
  EventId: string;
  EventStatus: 'Scheduled' | 'Started';
  EventType: 'Freeze' | 'Reboot' | 'Redeploy' | 'Preempt' | 'Terminate';
  ResourceType: 'VirtualMachine';
  Resources: string[];
  NotBefore: string;
  Description: string;
  EventSource: 'Platform' | 'User';
  DurationInSeconds: number;
}

export class FakeAzureMetadata extends FakeEndpoint {
  private incarnation = 1;
  private events: AzureEvent[] = [];

  constructor(readonly vmName: string) {
    super();
  }

  schedule(id: string, type: AzureEvent['EventType'], notBefore: number, resources: string[] = [this.vmName]): void {
    this.events.push({ EventId: id, EventStatus: 'Scheduled', EventType: type, ResourceType: 'VirtualMachine', Resources: resources, NotBefore: new Date(notBefore).toUTCString(), Description: `${type} scheduled`, EventSource: 'Platform', DurationInSeconds: type === 'Preempt' ? -1 : 900 });
    this.incarnation++;
  }

  cancel(id: string): void {
    this.events = this.events.filter((e) => e.EventId !== id);
    this.incarnation++;
  }

  protected handle(req: IncomingMessage, url: URL, res: ServerResponse): void {
    const json = (status: number, body: unknown) => {
      res.writeHead(status, { 'content-type': 'application/json; charset=utf-8' });
      res.end(JSON.stringify(body));
    };
    if (req.headers.metadata !== 'true') return json(400, { error: 'Bad request. Required metadata header not specified' });
    if (!url.searchParams.get('api-version')) return json(400, { error: 'Bad request. api-version was not specified in the request' });
    if (url.pathname === '/metadata/instance/compute/name' && url.searchParams.get('format') === 'text') return FakeEndpoint.text(res, 200, this.vmName);
    if (url.pathname === '/metadata/scheduledevents' && req.method === 'GET') return json(200, { DocumentIncarnation: this.incarnation, Events: this.events });
    return json(404, { error: 'Not found' });
  }
}
