import { watch as fsWatch, type FSWatcher } from 'node:fs';
import { mkdir, readdir, readFile, rename, unlink, writeFile } from 'node:fs/promises';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { isWorkerRecord, type Discovery, type DiscoveryEvent, type DiscoveryWatch, type WorkerRecord } from './discovery.js';

interface FileEntry {
  record: WorkerRecord;
  pid: number;
  hostname: string;
  heartbeat_at: number;
  ttl_ms: number;
  /** Set by each register(): a drain+resume quicker than a watcher's scan still reads as a new registration. */
  registered_at: number;
}

const HOST = hostname();

/** What makes a registration new to a watcher: its content or a fresh register() call, never a heartbeat. */
const identity = (e: FileEntry): string => `${e.registered_at}|${JSON.stringify(e.record)}`;

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Discovery for several processes on one machine: one JSON file per worker in a directory.
 * A record is a lease: its owner rewrites the heartbeat every ttl/3; readers drop a record whose
 * heartbeat is older than its TTL, or at once when its owner process on this host is gone.
 * Watchers react to inotify events on the directory and sweep for expiries once per second.
 */
export class FileDiscovery implements Discovery {
  readonly url: string;
  /** Per registered worker: its heartbeat timer and the beat being written, if any. */
  private readonly heartbeats = new Map<string, { timer: NodeJS.Timeout; beat: Promise<void> | undefined }>();
  private tmpSeq = 0;
  private readonly closers = new Set<() => Promise<void>>();

  constructor(
    private readonly dir: string,
    private readonly ttlMs = 3000,
  ) {
    this.url = `file://${dir}`;
  }

  private pathOf(workerId: string): string {
    return join(this.dir, `${encodeURIComponent(workerId)}.json`);
  }

  private async write(record: WorkerRecord, registeredAt: number): Promise<void> {
    const entry: FileEntry = { record, pid: process.pid, hostname: HOST, heartbeat_at: Date.now(), ttl_ms: this.ttlMs, registered_at: registeredAt };
    const path = this.pathOf(record.worker_id);
    const tmp = `${path}.${process.pid}.${this.tmpSeq++}.tmp`; // concurrent writers never share a temp file
    await writeFile(tmp, JSON.stringify(entry));
    await rename(tmp, path); // atomic: readers never see half a record
  }

  async register(record: WorkerRecord): Promise<void> {
    await mkdir(this.dir, { recursive: true });
    const registeredAt = Date.now();
    await this.stopHeartbeat(record.worker_id);
    await this.write(record, registeredAt);
    const hb: { timer: NodeJS.Timeout; beat: Promise<void> | undefined } = {
      timer: setInterval(() => {
        if (hb.beat) return;
        // A missed beat is survivable: the TTL covers three of them.
        hb.beat = this.write(record, registeredAt)
          .catch(() => undefined)
          .finally(() => (hb.beat = undefined));
      }, Math.max(100, Math.floor(this.ttlMs / 3))),
      beat: undefined,
    };
    hb.timer.unref();
    this.heartbeats.set(record.worker_id, hb);
  }

  /** Stops the beats and waits for one in progress, so no late beat can re-create the file. */
  private async stopHeartbeat(workerId: string): Promise<void> {
    const hb = this.heartbeats.get(workerId);
    if (!hb) return;
    clearInterval(hb.timer);
    this.heartbeats.delete(workerId);
    await hb.beat;
  }

  async unregister(workerId: string): Promise<void> {
    await this.stopHeartbeat(workerId);
    await unlink(this.pathOf(workerId)).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'ENOENT') throw err;
    });
  }

  async list(): Promise<WorkerRecord[]> {
    return (await this.entries()).map((e) => e.record);
  }

  /** Live entries: well-formed, heartbeat within TTL, owner process alive when on this host. */
  private async entries(): Promise<FileEntry[]> {
    await mkdir(this.dir, { recursive: true });
    const names = (await readdir(this.dir)).filter((n) => n.endsWith('.json'));
    const now = Date.now();
    const entries = await Promise.all(
      names.map(async (n) => {
        try {
          return JSON.parse(await readFile(join(this.dir, n), 'utf8')) as FileEntry;
        } catch {
          return null; // removed between readdir and read
        }
      }),
    );
    return entries
      .filter((e): e is FileEntry => e !== null && isWorkerRecord(e.record))
      .filter((e) => now - e.heartbeat_at <= e.ttl_ms && !(e.hostname === HOST && !processAlive(e.pid)));
  }

  async watch(listener: (event: DiscoveryEvent) => void): Promise<DiscoveryWatch> {
    await mkdir(this.dir, { recursive: true });
    let known = new Map<string, string>();
    let scanning = false;
    let rescan = false;
    let closed = false;
    const scan = async (): Promise<void> => {
      if (scanning) {
        rescan = true;
        return;
      }
      scanning = true;
      try {
        do {
          rescan = false;
          const next = new Map((await this.entries()).map((e) => [e.record.worker_id, e]));
          if (closed) return;
          for (const [id, e] of next) if (known.get(id) !== identity(e)) listener({ type: 'put', record: e.record });
          for (const id of known.keys()) if (!next.has(id)) listener({ type: 'delete', worker_id: id });
          known = new Map([...next].map(([id, e]) => [id, identity(e)]));
        } while (rescan);
      } finally {
        scanning = false;
      }
    };
    const initial = await this.entries();
    known = new Map(initial.map((e) => [e.record.worker_id, identity(e)]));
    listener({ type: 'reset', records: initial.map((e) => e.record) });
    const watcher: FSWatcher = fsWatch(this.dir, () => void scan());
    watcher.on('error', () => undefined);
    const sweep = setInterval(() => void scan(), 1000);
    sweep.unref();
    const close = async () => {
      closed = true;
      watcher.close();
      clearInterval(sweep);
      this.closers.delete(close);
    };
    this.closers.add(close);
    return { close };
  }

  onRegistrationLost(): () => void {
    return () => undefined; // the heartbeat rewrites a lost file itself
  }

  async close(): Promise<void> {
    await Promise.all([...this.heartbeats.keys()].map((id) => this.stopHeartbeat(id)));
    await Promise.all([...this.closers].map((c) => c()));
  }
}
