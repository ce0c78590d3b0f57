import { readFileSync, watch as fsWatch, type FSWatcher } from 'node:fs';
import { join } from 'node:path';
import { isLoading, type FleetEvent, type LoadingRecord, type WorkerRecord } from './discovery.js';
import { entryLive, identity, parseEntry, type FileEntry } from './file-record.js';
import { callListener, warn } from './guards.js';

/** One record file read: live, gone by its content (junk, expired, dead owner), absent, or not readable this time. */
type Read = { state: 'live'; entry: FileEntry } | { state: 'gone' | 'absent' } | { state: 'unreadable'; err: unknown };

const SWEEP_MS = 1000;

/**
 * Read synchronously: a record is a few hundred bytes in a local directory, and readFileSync costs
 * ~10 µs of CPU where fs.promises.readFile costs ~130 (four thread-pool round trips per file).
 */
export function readRecordFile(dir: string, name: string, now = Date.now(), livePid?: number): Read {
  let text: string;
  try {
    text = readFileSync(join(dir, name), 'utf8');
  } catch (err) {
    // Only an absent file may be gone; EMFILE, EACCES, EIO, EISDIR... say nothing about the worker.
    return (err as NodeJS.ErrnoException).code === 'ENOENT' ? { state: 'absent' } : { state: 'unreadable', err };
  }
  const entry = parseEntry(text, now);
  return entry && entryLive(entry, now, entry.pid !== livePid) ? { state: 'live', entry } : { state: 'gone' };
}

export interface FileWatchOptions {
  dir: string;
  /** Lists the record files (names ending .json); throws when the directory cannot be read, [] when it is gone. */
  list: () => Promise<string[]>;
}

/**
 * Watches a discovery directory incrementally. inotify names the file each event is about, so an
 * event costs one read of that file: with a thousand workers heartbeating, a change reads one file,
 * not a thousand. The directory is listed again only when a file read says it is absent (to tell a
 * removed record from a removed directory) and read whole only when an event names no file
 * (overflow, or a platform that does not say) or the watcher itself failed.
 *
 * Lease expiry needs no reads: each second the sweep checks the heartbeats it holds (and whether
 * local owners are alive), and re-reads only the records that look expired: the read decides, so a
 * beat the watcher missed keeps its worker. A record that cannot be read keeps its place in the view,
 * and is read again on the next sweep.
 */
export class FileWatch {
  /** What the listener was last told, by file name. */
  private readonly view = new Map<string, FileEntry>();
  /** Worker id -> the file names holding it (one, unless someone copied a record). */
  private readonly filesOf = new Map<string, Set<string>>();
  private readonly dirty = new Set<string>();
  /** Of the dirty names, those only an inotify event made dirty: most likely just rewritten by their owner. */
  private readonly beaten = new Set<string>();
  /** Unreadable this time: read again at the next sweep. */
  private readonly retry = new Set<string>();
  private needList = false;
  private needFull = false;
  private running = false;
  private closed = false;
  /** One warning per episode of failures, not one per event. */
  private failing = false;
  private watcher: FSWatcher | undefined;
  private sweep: NodeJS.Timeout | undefined;

  constructor(
    private readonly opts: FileWatchOptions,
    private readonly listener: (event: FleetEvent) => void,
  ) {}

  /** Reads the directory, tells the listener `reset`, then follows changes. */
  async start(): Promise<void> {
    // Watching first: a change made during the initial read is read again, not missed.
    try {
      this.watcher = fsWatch(this.opts.dir, (_type, name) => this.onEvent(name));
      this.watcher.on('error', () => this.watcherLost());
    } catch {
      this.watcher = undefined; // the sweep reads the directory whole instead
    }
    const names = await this.opts.list();
    const reads = this.readAll(names);
    for (const [name, r] of reads) if (r.state === 'live') this.set(name, r.entry);
    const records: WorkerRecord[] = [];
    const loading: LoadingRecord[] = [];
    for (const e of this.byWorker().values()) {
      if (isLoading(e.record)) loading.push(e.record);
      else records.push(e.record);
    }
    callListener('watch', this.listener, { type: 'reset', records, loading });
    this.sweep = setInterval(() => this.onSweep(), SWEEP_MS);
    this.sweep.unref();
    this.pump();
  }

  async close(): Promise<void> {
    this.closed = true;
    this.watcher?.close();
    clearInterval(this.sweep);
  }

  private onEvent(name: string | Buffer | null): void {
    if (this.closed) return;
    if (name === null) this.needFull = true;
    else {
      const n = name.toString();
      if (!n.endsWith('.json')) return; // not a record (older writers' temp files: their rename names the .json)
      if (!this.dirty.has(n)) this.beaten.add(n);
      this.dirty.add(n);
    }
    this.pump();
  }

  private watcherLost(): void {
    this.watcher?.close();
    this.watcher = undefined;
    this.needFull = true;
  }

  private onSweep(): void {
    if (this.closed) return;
    const now = Date.now();
    for (const [name, e] of this.view) if (!entryLive(e, now)) this.markDirty(name);
    for (const name of this.retry) this.markDirty(name);
    this.retry.clear();
    // Without a working watcher nothing says what changed: the sweep is all there is (polling).
    if (!this.watcher) this.needFull = true;
    this.pump();
  }

  /** Dirty for a reason other than its owner's write: its read checks the owner too. */
  private markDirty(name: string): void {
    this.beaten.delete(name);
    this.dirty.add(name);
  }

  private byWorker(): Map<string, FileEntry> {
    return new Map([...this.view.values()].map((e) => [e.record.worker_id, e]));
  }


  private readAll(names: string[]): Map<string, Read> {
    const out = new Map<string, Read>();
    const now = Date.now();
    // A heartbeat from the owner the view already holds: the sweep checks that process each second.
    for (const n of names) out.set(n, readRecordFile(this.opts.dir, n, now, this.beaten.delete(n) ? this.view.get(n)?.pid : undefined));
    return out;
  }

  /** Applies what changed; one run at a time, and a run goes on while there is more to read. */
  private pump(): void {
    if (this.running || this.closed) return;
    if (!this.needFull && !this.needList && this.dirty.size === 0) return;
    this.running = true;
    void this.drain().finally(() => {
      this.running = false;
      this.pump(); // what arrived after the run's last look
    });
  }

  private async drain(): Promise<void> {
    while (!this.closed && (this.needFull || this.needList || this.dirty.size > 0)) {
      const changes: Array<[string, FileEntry | undefined]> = [];
      if (this.needFull || this.needList) {
        const full = this.needFull;
        this.needFull = this.needList = false;
        let names: string[];
        try {
          names = await this.opts.list();
        } catch (err) {
          if (full) this.needFull = true;
          else this.needList = true;
          this.fail(`scan of ${this.opts.dir} failed, keeping the last view until one succeeds`, err);
          return; // the next event or sweep tries again
        }
        const listed = new Set(names);
        for (const name of this.view.keys()) if (!listed.has(name)) changes.push([name, undefined]);
        for (const name of names) if (full || !this.view.has(name)) this.markDirty(name);
        if (this.closed) return;
      }
      const batch = [...this.dirty];
      this.dirty.clear();
      const reads = this.readAll(batch);
      if (this.closed) return;
      let unreadable: unknown;
      for (const [name, r] of reads) {
        if (r.state === 'live') changes.push([name, r.entry]);
        else if (r.state === 'gone') changes.push([name, undefined]);
        else if (r.state === 'absent') {
          if (this.view.has(name)) this.needList = true; // the record, or the whole directory? The listing says.
        } else if (r.state === 'unreadable') {
          unreadable = r.err;
          this.retry.add(name); // as it was, until a read succeeds
        }
      }
      if (unreadable === undefined) this.failing = false;
      else this.fail(`read in ${this.opts.dir} failed, keeping the last view until one succeeds`, unreadable);
      this.apply(changes);
    }
  }

  private fail(what: string, err: unknown): void {
    if (!this.closed && !this.failing) warn(what, err);
    this.failing = true;
  }

  /** The entry the listener knows for worker `id` (the last file holding it, should there be two). */
  private current(id: string): FileEntry | undefined {
    let e: FileEntry | undefined;
    for (const name of this.filesOf.get(id) ?? []) e = this.view.get(name) ?? e;
    return e;
  }

  private set(name: string, entry: FileEntry | undefined): void {
    const old = this.view.get(name);
    if (old) {
      const files = this.filesOf.get(old.record.worker_id);
      files?.delete(name);
      if (files?.size === 0) this.filesOf.delete(old.record.worker_id);
    }
    if (!entry) {
      this.view.delete(name);
      return;
    }
    this.view.set(name, entry);
    let files = this.filesOf.get(entry.record.worker_id);
    if (!files) this.filesOf.set(entry.record.worker_id, (files = new Set()));
    files.add(name);
  }

  /** Updates the view and tells the listener what that changed, per worker: O(changes), not O(view). */
  private apply(changes: Array<[string, FileEntry | undefined]>): void {
    const before = new Map<string, FileEntry | undefined>();
    const note = (id: string) => {
      if (!before.has(id)) before.set(id, this.current(id));
    };
    for (const [name, entry] of changes) {
      const old = this.view.get(name);
      if (old) note(old.record.worker_id);
      if (entry) note(entry.record.worker_id);
      this.set(name, entry);
    }
    for (const [id, was] of before) {
      const now = this.current(id);
      if (now && (!was || identity(was) !== identity(now))) {
        const r = now.record;
        callListener('watch', this.listener, isLoading(r) ? { type: 'loading', record: r } : { type: 'put', record: r });
      }
      else if (!now && was) callListener('watch', this.listener, { type: 'delete', worker_id: id });
    }
  }
}
