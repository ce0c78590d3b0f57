import { realpath } from 'node:fs/promises';
import { posix, resolve, sep } from 'node:path';
import type { AdapterSource } from '../engine/engine-adapters.js';
import { isAdapterName } from '../protocol/adapters.js';
import { EbbError } from '../protocol/errors.js';

/** Where the engine reads an adapter's path: this machine's files (llama-cpp), an engine server's (--engine openai), or nowhere (the mocker). */
export type AdapterFiles = 'local' | 'engine-server' | 'none';

export function adapterFilesOf(engineKind: string): AdapterFiles {
  return engineKind === 'llama-cpp' ? 'local' : engineKind === 'openai' ? 'engine-server' : 'none';
}

export interface AdapterPolicyOptions {
  /** The worker's model: no adapter may take its name. */
  model: string;
  /** --lora-dir: where an admin load may read adapters the worker was not started with. */
  dirs: readonly string[];
  files: AdapterFiles;
}

/**
 * What an admin load (POST /engine/adapters/{name}/load) may make the engine read. A worker
 * without an admin token answers every process on its machine (its listener is on loopback), so a
 * load must not read any file it names, nor take a name that shadows the model. The rule: a load
 * reads only a path the operator gave, the adapter's own (its --lora, or the path it was loaded
 * from) or one under a --lora-dir; the name is an adapter name (as --lora and --mocker-lora are
 * checked) other than the model's. A directory, not only the paths given at start, because
 * operators add adapters to a running fleet (a new fine-tune) without a restart: the directory
 * says where those may come from, and nothing outside it is read. Paths on this machine are
 * resolved, symlinks followed, so a link in the directory cannot point out of it; an engine
 * server's are checked as written (normalised: no `..` gets out). The mocker reads no files: it
 * takes new names, never a path.
 */
export class AdapterPolicy {
  constructor(private readonly opts: AdapterPolicyOptions) {}

  /** Throws unless `source` may be loaded; `known` is what the worker holds under that name (its path the operator's). */
  async check(source: AdapterSource, known: AdapterSource | undefined): Promise<void> {
    const { name, path } = source;
    if (!isAdapterName(name)) throw new EbbError('invalid_request', `"${name}" is not an adapter name (letters, digits, . _ : @ -; at most 128)`, { param: 'name' });
    if (name === this.opts.model) throw new EbbError('invalid_request', `"${name}" is this worker's model: an adapter needs a name of its own`, { param: 'name' });
    if (this.opts.files === 'none') {
      if (path !== undefined) throw new EbbError('invalid_request', 'this engine (the mocker) loads no files: leave out path', { param: 'path' });
      return;
    }
    if (path === undefined) {
      if (known !== undefined) return;
      throw new EbbError('invalid_request', `"${name}" is not an adapter this worker was started with: a new one needs its path, under ${this.dirsSaid()}`, { param: 'path' });
    }
    if (known?.path !== undefined && (await this.same(path, known.path))) return;
    if (await this.underDir(path)) return;
    throw new EbbError('forbidden', `adapter "${name}" may not be loaded from ${path}: a load reads only the adapter's own path (its --lora) or one under ${this.dirsSaid()}`);
  }

  private dirsSaid(): string {
    return this.opts.dirs.length === 0 ? 'a --lora-dir (this worker has none)' : `--lora-dir (${this.opts.dirs.join(', ')})`;
  }

  private async same(a: string, b: string): Promise<boolean> {
    return (await this.canonical(a)) === (await this.canonical(b));
  }

  private async underDir(path: string): Promise<boolean> {
    const at = await this.canonical(path);
    for (const dir of this.opts.dirs) {
      const d = await this.canonical(dir);
      const inside = this.opts.files === 'local' ? (d.endsWith(sep) ? d : d + sep) : d.endsWith('/') ? d : `${d}/`;
      if (at.startsWith(inside)) return true;
    }
    return false;
  }

  /** The path as the engine would reach it: on this machine resolved (symlinks followed where it exists); an engine server's normalised. */
  private async canonical(path: string): Promise<string> {
    if (this.opts.files === 'engine-server') return path.startsWith('/') ? posix.normalize(path) : path;
    const abs = resolve(path);
    try {
      return await realpath(abs);
    } catch {
      return abs; // not there (yet): the engine's load says so
    }
  }
}
