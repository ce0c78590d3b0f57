import { watch, type FSWatcher } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { basename, dirname } from 'node:path';
import type { Logger } from 'pino';
import { parseLimits, type LimitsTable } from './tenant-limits.js';

/** Changes to the file's directory within this of each other are read once (an editor writes in steps). */
const SETTLE_MS = 100;

/**
 * `--limits-file`: read at start (a bad file stops the frontend, naming what is wrong), then
 * followed: any change in its directory (an edit, a rename over it, a Kubernetes ConfigMap's
 * symlink swap) reads it again, and limits change without a restart. A file that no longer parses
 * keeps the limits in force, logged; one that is gone keeps them too.
 */
export class LimitsFile {
  private current: LimitsTable;
  private text: string;
  private watcher: FSWatcher | undefined;
  private timer: NodeJS.Timeout | undefined;
  private reading: Promise<void> = Promise.resolve();

  private constructor(
    readonly path: string,
    text: string,
    private readonly log: Logger,
  ) {
    this.text = text;
    this.current = parseLimits(text, path);
  }

  /** Reads and parses `path`; throws (the frontend does not start) when it cannot. */
  static async open(path: string, log: Logger): Promise<LimitsFile> {
    let text: string;
    try {
      text = await readFile(path, 'utf8');
    } catch (err) {
      throw new Error(`cannot read --limits-file ${path}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
    const file = new LimitsFile(path, text, log);
    file.follow();
    return file;
  }

  get table(): LimitsTable {
    return this.current;
  }

  private follow(): void {
    const name = basename(this.path);
    try {
      this.watcher = watch(dirname(this.path), (_event, changed) => {
        // A ConfigMap swaps a `..data` symlink, not the file's own name: any change may be it.
        if (changed !== null && changed !== name && !changed.startsWith('..')) return;
        clearTimeout(this.timer);
        this.timer = setTimeout(() => void (this.reading = this.reading.then(() => this.reload())), SETTLE_MS);
      });
      this.watcher.on('error', () => undefined);
      this.watcher.unref();
    } catch (err) {
      this.log.warn({ event: 'limits_file_unwatched', path: this.path, err: (err as Error).message }, `cannot follow ${this.path} (${(err as Error).message}): its limits change only with a restart`);
    }
  }

  /** Reads the file again; a change that parses replaces the limits, one that does not is logged and ignored. */
  async reload(): Promise<void> {
    let text: string;
    try {
      text = await readFile(this.path, 'utf8');
    } catch (err) {
      this.log.warn({ event: 'limits_reload_failed', path: this.path, err: (err as NodeJS.ErrnoException).code ?? (err as Error).message }, `cannot read ${this.path}: the limits in force stay`);
      return;
    }
    if (text === this.text) return;
    try {
      this.current = parseLimits(text, this.path);
      this.text = text;
      this.log.info({ event: 'limits_reloaded', path: this.path, tenants: this.current.tenants.size, any_tenant: this.current.any !== undefined }, `limits reloaded from ${this.path}: ${this.current.tenants.size} tenant(s)${this.current.any !== undefined ? ' and *' : ''}`);
    } catch (err) {
      this.log.error({ event: 'limits_reload_failed', path: this.path, err: (err as Error).message }, `${(err as Error).message}: the limits in force stay`);
    }
  }

  close(): void {
    clearTimeout(this.timer);
    this.watcher?.close();
  }
}
