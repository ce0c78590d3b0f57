import { watch as fsWatch, type FSWatcher } from 'node:fs';
import { readdir, readFile, rename, unlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { entryLive, HOST } from './file-record.js';
import { parseRouteMark, type RouteMark, type RouteMarks } from './route-marks.js';
import { ensurePrivateDir } from './private-dir.js';

/** Under the discovery directory, beside the worker records (which are its top-level .json files). */
export const ROUTES_DIR = 'routes';
/** Expiries are noticed by this sweep, as FileWatch notices workers' (file-watch.ts). */
const SWEEP_MS = 1000;

interface MarkFile {
  mark: RouteMark;
  pid: number;
  hostname: string;
  heartbeat_at: number;
  ttl_ms: number;
}

/**
 * File discovery's marks: one file per frontend in <dir>/routes/, rewritten every ttl/3 (its lease)
 * and whenever the mark changes, written whole through a rename. A mark whose heartbeat is older
 * than its TTL, or whose owner process on this host is gone, is not live.
 */
export class FileRouteMarks implements RouteMarks {
  private readonly dir: string;
  private readonly beats = new Map<string, { timer: NodeJS.Timeout; mark: RouteMark; writing: Promise<void> | undefined }>();
  private seq = 0;

  constructor(
    discoveryDir: string,
    private readonly ttlMs: number,
  ) {
    this.dir = join(discoveryDir, ROUTES_DIR);
  }

  private pathOf(frontendId: string): string {
    return join(this.dir, `${encodeURIComponent(frontendId)}.json`);
  }

  private async write(mark: RouteMark): Promise<void> {
    await ensurePrivateDir(this.dir);
    const file: MarkFile = { mark, pid: process.pid, hostname: HOST, heartbeat_at: Date.now(), ttl_ms: this.ttlMs };
    // A temporary name that is not a mark (.tmp), renamed over the mark: readers never see half of one.
    const tmp = join(this.dir, `${encodeURIComponent(mark.frontend_id)}.${process.pid}.${this.seq++}.tmp`);
    await writeFile(tmp, JSON.stringify(file), { mode: 0o600 });
    await rename(tmp, this.pathOf(mark.frontend_id));
  }

  async publish(mark: RouteMark): Promise<void> {
    const held = this.beats.get(mark.frontend_id);
    if (held !== undefined) {
      held.mark = mark;
      await held.writing;
      await this.write(mark);
      return;
    }
    await this.write(mark);
    const beat: { timer: NodeJS.Timeout; mark: RouteMark; writing: Promise<void> | undefined } = {
      mark,
      writing: undefined,
      timer: setInterval(() => {
        if (beat.writing) return;
        // A missed beat is survivable: the TTL covers three.
        beat.writing = this.write(beat.mark)
          .catch(() => undefined)
          .finally(() => (beat.writing = undefined));
      }, Math.max(100, Math.floor(this.ttlMs / 3))),
    };
    beat.timer.unref();
    this.beats.set(mark.frontend_id, beat);
  }

  async withdraw(frontendId: string): Promise<void> {
    const beat = this.beats.get(frontendId);
    if (beat !== undefined) {
      clearInterval(beat.timer);
      this.beats.delete(frontendId);
      await beat.writing;
    }
    await unlink(this.pathOf(frontendId)).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'ENOENT') throw err;
    });
  }

  async list(): Promise<RouteMark[]> {
    let names: string[];
    try {
      names = (await readdir(this.dir)).filter((n) => n.endsWith('.json'));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return []; // no frontend ever marked
      throw err;
    }
    const now = Date.now();
    const marks = await Promise.all(
      names.map(async (name) => {
        let file: Partial<MarkFile>;
        try {
          file = JSON.parse(await readFile(join(this.dir, name), 'utf8')) as Partial<MarkFile>;
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code === 'ENOENT' || err instanceof SyntaxError) return undefined; // removed meanwhile, or junk
          throw err; // unreadable now (EMFILE...): the caller keeps what it knew
        }
        const mark = parseRouteMark(file.mark);
        const lease = typeof file.pid === 'number' && typeof file.hostname === 'string' && typeof file.heartbeat_at === 'number' && typeof file.ttl_ms === 'number';
        return mark !== undefined && lease && entryLive(file as MarkFile, now) ? mark : undefined;
      }),
    );
    return marks.filter((m): m is RouteMark => m !== undefined);
  }

  async watch(changed: () => void): Promise<{ close(): Promise<void> }> {
    await ensurePrivateDir(this.dir);
    let watcher: FSWatcher | undefined;
    try {
      watcher = fsWatch(this.dir, (_type, name) => {
        if (name === null || name.toString().endsWith('.json')) changed();
      });
      watcher.on('error', () => undefined); // the sweep still reads every second
    } catch {
      watcher = undefined;
    }
    const sweep = setInterval(changed, SWEEP_MS);
    sweep.unref();
    return {
      close: async () => {
        watcher?.close();
        clearInterval(sweep);
      },
    };
  }

  async close(): Promise<void> {
    await Promise.all([...this.beats.keys()].map((id) => this.withdraw(id).catch(() => undefined)));
  }
}
