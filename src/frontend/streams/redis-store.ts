import { readFileSync } from 'node:fs';
import { Cluster, Redis, type RedisOptions } from 'ioredis';
import type { Logger } from 'pino';

/** A connection to the fleet's stream store: one Redis, a Sentinel-watched master, or a Redis Cluster. */
export type RedisClient = Redis | Cluster;

/** Where the stream store is, as `--stream-store` names it (see parseStoreUrl). */
export interface StoreAddress {
  kind: 'single' | 'sentinel' | 'cluster';
  /** The URL with its password hidden: what logs and errors show. */
  display: string;
  connect(overrides: Partial<RedisOptions>): RedisClient;
}

/** The environment variable a password can come from, instead of the URL (which is logged, redacted). */
export const STORE_PASSWORD_ENV = 'EBB_STREAM_STORE_PASSWORD';

const SCHEMES = ['redis:', 'rediss:', 'redis+sentinel:', 'redis+cluster:'];

/** Whether `url` names a Redis stream store in one of the forms parseStoreUrl takes. */
export function isStoreUrl(url: string): boolean {
  return SCHEMES.some((s) => url.startsWith(`${s}//`));
}

/** `url` with its password (if any) replaced by `***`. */
export function redactUrl(url: string): string {
  return url.replace(/^([a-z+]+:\/\/)([^@/]*:)[^@/]*@/, '$1$2***@');
}

function hosts(list: string, defaultPort: number): Array<{ host: string; port: number }> {
  return list.split(',').map((hp) => {
    const m = /^(\[[^\]]+\]|[^:]+)(?::(\d+))?$/.exec(hp.trim());
    if (m === null) throw new Error(`bad host:port "${hp}"`);
    return { host: m[1]!.replace(/^\[|\]$/g, ''), port: m[2] === undefined ? defaultPort : Number(m[2]) };
  });
}

/**
 * The stream store's address. Forms:
 * - `redis://[user:password@]host:port[/db]`, `rediss://...` (TLS): one Redis;
 * - `redis+sentinel://[user:password@]host:port[,host:port...]/<master name>[/db]`: the master that
 *   these Sentinels name (ioredis follows failovers);
 * - `redis+cluster://[user:password@]host:port[,host:port...]`: a Redis Cluster (seed nodes).
 * `password` (from --stream-store-password-file or $EBB_STREAM_STORE_PASSWORD) replaces the URL's.
 */
export function parseStoreUrl(url: string, password?: string | undefined): StoreAddress {
  const display = redactUrl(url);
  const m = /^(redis\+sentinel|redis\+cluster):\/\/(?:([^:@/]*)(?::([^@/]*))?@)?([^/]+)(?:\/([^/]*))?(?:\/(\d+))?$/.exec(url);
  if (m === null) {
    if (!/^rediss?:\/\/./.test(url)) throw new Error(`not a stream store URL: ${display}`);
    return { kind: 'single', display, connect: (o) => new Redis(url, { ...o, ...(password !== undefined && { password }) }) };
  }
  const [, scheme, user, urlPassword, list, name, db] = m;
  const auth = { ...(user !== undefined && user !== '' && { username: decodeURIComponent(user) }), ...((password ?? urlPassword) !== undefined && { password: password ?? decodeURIComponent(urlPassword!) }) };
  if (scheme === 'redis+sentinel') {
    if (name === undefined || name === '') throw new Error(`${display}: a Sentinel URL names its master: redis+sentinel://host:26379[,host:26379]/<master name>`);
    const sentinels = hosts(list!, 26379);
    return {
      kind: 'sentinel',
      display,
      // The Sentinels take the same password as the master (Redis' usual setup), and the master's address is theirs to say.
      connect: (o) => new Redis({ ...o, ...auth, sentinels, name, ...(auth.password !== undefined && { sentinelPassword: auth.password }), ...(db !== undefined && { db: Number(db) }) }),
    };
  }
  if (name !== undefined && name !== '') throw new Error(`${display}: a cluster URL has no path (the cluster has one database)`);
  const nodes = hosts(list!, 6379);
  return {
    kind: 'cluster',
    display,
    connect: (o) => {
      const { enableOfflineQueue, enableAutoPipelining, lazyConnect, ...node } = o;
      return new Cluster(nodes, { enableOfflineQueue, enableAutoPipelining, lazyConnect, redisOptions: { ...node, ...auth } });
    },
  };
}

/** The password from a file (its first line), else the environment; undefined: the URL's, if any. */
export function storePassword(file: string | undefined): string | undefined {
  if (file !== undefined) return readFileSync(file, 'utf8').split('\n')[0]!;
  return process.env[STORE_PASSWORD_ENV] || undefined;
}

/** A frontend's connections' name: no spaces (CLIENT LIST separates fields by them). */
const connectionName = (owner: string) => `ebb-frontend:${owner.replace(/[^\w.:-]/g, '_')}`;

/** How long one CLIENT LIST answers who is connected. */
const CLIENT_LIST_MS = 250;

/** How often the store's health is checked, and how long a PING may take before Redis counts as down (a frozen Redis answers nothing). */
const HEALTH_EVERY_MS = 1_000;
const COMMAND_TIMEOUT_MS = 2_000;

/**
 * The fleet's stream store, connected: the command connection (no offline queue: a stream never
 * waits on Redis; each command bounded), a subscriber for the fleet's notices, blocking readers
 * made on demand, and the store's health: a PING each second, answered within its bound or the
 * store is down. A refused write (maxmemory) is not an outage: the copy it belonged to mends itself.
 */
export class RedisStore {
  readonly client: RedisClient;
  private subscriber: RedisClient | undefined;
  private readonly handlers = new Map<string, (message: string) => void>();
  private clients: { at: number; list: Promise<string> } | undefined;
  private up = false;
  private upSince = performance.now();
  private known = false;
  private pinger: NodeJS.Timeout | undefined;
  private closing = false;

  constructor(
    readonly address: StoreAddress,
    private readonly log: Logger,
    private readonly onHealth: (up: boolean) => void,
    /** This frontend: its connections are named for it, so the others see at once when it is gone (connected()). */
    private readonly owner: string,
  ) {
    this.client = address.connect({ enableOfflineQueue: false, maxRetriesPerRequest: 0, enableAutoPipelining: true, lazyConnect: true, commandTimeout: COMMAND_TIMEOUT_MS, connectionName: connectionName(owner) });
    // Connection errors are the health check's to report, once per change.
    this.client.on('error', () => undefined);
  }

  get healthy(): boolean {
    return this.up;
  }

  /** Since when (performance.now()) the store has answered without a break: a lease unconfirmed for longer than its term is this process's fault. */
  get healthySince(): number {
    return this.upSince;
  }

  /**
   * Connects before the frontend serves (bounded), and says once whether the store is there. Redis
   * not there is no reason not to serve: new streams run unshared until it comes (the client keeps
   * reconnecting).
   */
  async connect(boundMs: number): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const connected = this.client.connect().then(
      () => true,
      () => false,
    );
    const ok = await Promise.race([connected, new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), boundMs)))]);
    clearTimeout(timer);
    this.health(ok && (await this.ping()));
    this.pinger = setInterval(() => void this.ping().then((up) => this.health(up)), HEALTH_EVERY_MS).unref();
    this.subscriber = this.duplicate(undefined);
    this.subscriber.on('error', () => undefined);
    this.subscriber.on('message', (channel: string, message: string) => this.handlers.get(channel)?.(message));
  }

  /** Hears `channel`'s messages (a fleet's notices: cancels, hand-ons), from now on. */
  listen(channel: string, handler: (message: string) => void): void {
    this.handlers.set(channel, handler);
    this.subscriber?.subscribe(channel).catch(() => undefined);
  }

  publish(channel: string, message: string): Promise<void> {
    return this.client.publish(channel, message).then(() => undefined);
  }

  /** A connection of its own for blocking reads (XREAD BLOCK), bounded a little past `blockMs`. */
  reader(blockMs: number): RedisClient {
    const r = this.duplicate(blockMs + COMMAND_TIMEOUT_MS);
    r.on('error', () => undefined);
    return r;
  }

  /** Another connection like the command one, whose commands wait for it to connect (bounded by `commandTimeout`). */
  private duplicate(commandTimeout: number | undefined): RedisClient {
    const c = this.client;
    if (c instanceof Cluster) return c.duplicate(undefined, { enableOfflineQueue: true, redisOptions: { ...c.options.redisOptions, commandTimeout } });
    return c.duplicate({ enableOfflineQueue: true, commandTimeout });
  }

  /**
   * Whether frontend `owner` still has a connection to the store: a frontend killed or crashed
   * loses its connections at once (the kernel closes them), long before its leases run out.
   * Undefined when that cannot be told (a Redis Cluster: its connections are spread over nodes).
   * One CLIENT LIST serves every question for a quarter of a second.
   */
  async connected(owner: string): Promise<boolean | undefined> {
    if (this.address.kind === 'cluster') return undefined;
    const now = performance.now();
    if (this.clients === undefined || now - this.clients.at > CLIENT_LIST_MS) this.clients = { at: now, list: (this.client as Redis).call('CLIENT', 'LIST', 'TYPE', 'normal') as Promise<string> };
    try {
      return (await this.clients.list).includes(` name=${connectionName(owner)} `);
    } catch {
      this.clients = undefined;
      return undefined;
    }
  }

  private async ping(): Promise<boolean> {
    try {
      return (await this.client.ping()) === 'PONG';
    } catch {
      return false;
    }
  }

  private health(up: boolean): void {
    if (this.closing || (this.known && up === this.up)) return;
    const first = !this.known;
    this.known = true;
    this.up = up;
    if (up) this.upSince = performance.now();
    this.onHealth(up);
    const where = { url: this.address.display, kind: this.address.kind };
    if (up) this.log.info({ event: first ? 'stream_store_connected' : 'stream_store_available', ...where }, `the stream store (${this.address.display}) is ${first ? 'connected' : 'back'}: streams are shared with the fleet's other frontends`);
    else
      this.log.warn(
        { event: 'stream_store_unavailable', ...where },
        `the stream store (${this.address.display}) cannot be reached: streams run on, resumable only at the frontend that runs them, until it is back`,
      );
  }

  /** Stops checking and hearing, then lets what is pipelined reach Redis (bounded), quietly: a normal stop is no outage. */
  async close(): Promise<void> {
    this.closing = true;
    clearInterval(this.pinger);
    this.subscriber?.disconnect();
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.client.quit().catch(() => undefined), new Promise((resolve) => (timer = setTimeout(resolve, 1_000)))]);
    clearTimeout(timer);
    this.client.disconnect();
  }
}
