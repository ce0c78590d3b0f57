import { statSync } from 'node:fs';
import { readdir, readFile, rename, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { isLoading, type AnyRecord, type Discovery, type DiscoveryEvent, type DiscoveryWatch, type FleetEvent, type WorkerRecord } from './discovery.js';
import { servingOnly } from './serving-only.js';
import { entryLive, HOST, MAX_TTL_MS, MIN_TTL_MS, parseEntry, type FileEntry } from './file-record.js';
import { FileWatch } from './file-watch.js';
import { FileScaleDownLocks } from './scale-down-lock.js';
import { FileRouteMarks } from './file-route-marks.js';
import { assertPrivate, ensurePrivateDir, UnsafeDirectoryError } from './private-dir.js';

/** Where records are written before the rename that publishes them. */
const TMP_DIR = '.tmp';

/** One file as read by a scan: live, gone (absent, expired, dead owner, junk), or not readable this time. */
type Read = { name: string; state: 'live'; entry: FileEntry } | { name: string; state: 'gone' | 'unreadable' };

/**
 * Discovery for several processes on one machine: one JSON file per worker in a directory.
 * A record is a lease: its owner rewrites the heartbeat every ttl/3; readers drop a record whose
 * heartbeat is older than its TTL, or at once when its owner process on this host is gone.
 * Watchers read what inotify says changed and sweep for expiries once per second (file-watch.ts).
 * The directory must be this user's and writable by nobody else; a watcher that cannot read
 * (fd exhaustion, say) keeps what it last knew rather than dropping live workers.
 */
export class FileDiscovery implements Discovery {
  readonly url: string;
  readonly scaleDownLocks: FileScaleDownLocks;
  readonly routeMarks: FileRouteMarks;
  /** Per registered worker: its heartbeat timer and the beat being written, if any. */
  private readonly heartbeats = new Map<string, { timer: NodeJS.Timeout; beat: Promise<void> | undefined }>();
  private tmpSeq = 0;
  private readonly closers = new Set<() => Promise<void>>();
  /** Set once the directory exists and passed the ownership check; cleared if it disappears. */
  private dirChecked = false;
  private tmpReady = false;

  constructor(
    private readonly dir: string,
    private readonly ttlMs = 3000,
  ) {
    this.url = `file://${dir}`;
    this.scaleDownLocks = new FileScaleDownLocks(dir);
    this.routeMarks = new FileRouteMarks(dir, ttlMs);
    if (!(ttlMs >= MIN_TTL_MS && ttlMs <= MAX_TTL_MS)) {
      throw new Error(`file discovery lease TTL must be between ${MIN_TTL_MS} ms and ${MAX_TTL_MS} ms, got ${ttlMs}`);
    }
    // Refuse an unsafe directory at once when it exists; one that does not is checked once created.
    try {
      assertPrivate(dir, statSync(dir));
      this.dirChecked = true;
    } catch (err) {
      if (err instanceof UnsafeDirectoryError) throw err;
    }
  }

  private async ensureDir(): Promise<void> {
    if (this.dirChecked) return;
    await ensurePrivateDir(this.dir);
    this.dirChecked = true;
  }

  private pathOf(workerId: string): string {
    return join(this.dir, `${encodeURIComponent(workerId)}.json`);
  }

  private async write(record: AnyRecord, registeredAt: number): Promise<void> {
    await this.ensureDir();
    const entry: FileEntry = { record, pid: process.pid, hostname: HOST, heartbeat_at: Date.now(), ttl_ms: this.ttlMs, registered_at: registeredAt };
    const path = this.pathOf(record.worker_id);
    // Written beside the directory's records, not among them: a watcher (inotify is per directory)
    // then sees one event per beat, the rename, instead of four. Concurrent writers never share one.
    const tmp = join(this.dir, TMP_DIR, `${encodeURIComponent(record.worker_id)}.${process.pid}.${this.tmpSeq++}.tmp`);
    try {
      if (!this.tmpReady) {
        await ensurePrivateDir(join(this.dir, TMP_DIR));
        this.tmpReady = true;
      }
      await writeFile(tmp, JSON.stringify(entry), { mode: 0o600 });
      await rename(tmp, path); // atomic: readers never see half a record
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') this.dirChecked = this.tmpReady = false; // removed under us: recreate next time
      throw err;
    }
  }

  async register(record: AnyRecord): Promise<void> {
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

  /** Live serving records; one that cannot be read right now is left out (there is no earlier view to keep). */
  async list(): Promise<WorkerRecord[]> {
    return (await this.read()).flatMap((r) => (r.state === 'live' && !isLoading(r.entry.record) ? [r.entry.record] : []));
  }

  /** The record files' names; [] when the directory is gone. Throws when it cannot be read. */
  private async names(): Promise<string[]> {
    try {
      return (await readdir(this.dir)).filter((n) => n.endsWith('.json'));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      this.dirChecked = false; // removed under us: no records, and recreate (and check) next time
      return [];
    }
  }

  /** Every record file, classified. Throws when the directory itself cannot be read. */
  private async read(): Promise<Read[]> {
    await this.ensureDir();
    const names = await this.names();
    const now = Date.now();
    return Promise.all(
      names.map(async (name): Promise<Read> => {
        let text: string;
        try {
          text = await readFile(join(this.dir, name), 'utf8');
        } catch (err) {
          // Only an absent file is gone; EMFILE, EACCES, EIO... say nothing about the worker.
          return { name, state: (err as NodeJS.ErrnoException).code === 'ENOENT' ? 'gone' : 'unreadable' };
        }
        const entry = parseEntry(text, now);
        return entry && entryLive(entry, now) ? { name, state: 'live', entry } : { name, state: 'gone' };
      }),
    );
  }

  async watch(listener: (event: DiscoveryEvent) => void): Promise<DiscoveryWatch> {
    return this.watchAll(servingOnly(listener));
  }

  async watchAll(listener: (event: FleetEvent) => void): Promise<DiscoveryWatch> {
    await this.ensureDir();
    const w = new FileWatch({ dir: this.dir, list: () => this.names() }, listener);
    await w.start();
    const close = async () => {
      await w.close();
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
    await this.routeMarks.close();
  }
}
