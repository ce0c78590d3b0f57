/**
 * Where file discovery lives, and the rule that keeps other users out of it: a directory anyone
 * else can write is a directory anyone else can register workers in (or remove them from).
 */
import { mkdirSync, statSync } from 'node:fs';
import { mkdir, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';

/** Per user: `$XDG_RUNTIME_DIR/ebb` when set, else `<tmpdir>/ebb-<uid>`. */
export function discoveryBaseDir(env: NodeJS.ProcessEnv = process.env): string {
  const runtime = env.XDG_RUNTIME_DIR;
  if (runtime) return join(runtime, 'ebb');
  const uid = process.getuid?.();
  return join(tmpdir(), uid === undefined ? 'ebb' : `ebb-${uid}`);
}

/** Where components started separately on one machine meet by default. */
export function defaultDiscoveryDir(env: NodeJS.ProcessEnv = process.env): string {
  return join(discoveryBaseDir(env), 'discovery');
}

export class UnsafeDirectoryError extends Error {
  override readonly name = 'UnsafeDirectoryError';
}

export interface DirStat {
  uid: number;
  mode: number;
  isDirectory(): boolean;
}

/** Throws an UnsafeDirectoryError unless `path` is a directory of ours that nobody else can write. */
export function assertPrivate(path: string, st: DirStat): void {
  const uid = process.getuid?.();
  if (uid === undefined) return; // no POSIX owners here (Windows)
  if (!st.isDirectory()) throw new UnsafeDirectoryError(`discovery directory ${path} is not a directory`);
  if (st.uid !== uid) {
    throw new UnsafeDirectoryError(`discovery directory ${path} is owned by uid ${st.uid}, not by this user (uid ${uid}): refusing it; use a directory of your own`);
  }
  if ((st.mode & 0o022) !== 0) {
    throw new UnsafeDirectoryError(`discovery directory ${path} is writable by group or others (mode ${(st.mode & 0o777).toString(8)}): refusing it; chmod 700 it or use another`);
  }
}

/** `path` and the parents of it that mkdir created, the first of which is `created`. */
function createdChain(path: string, created: string | undefined): string[] {
  const chain = [path];
  if (created === undefined || !path.startsWith(created)) return chain;
  for (let p = path; p !== created && dirname(p) !== p; ) {
    p = dirname(p);
    chain.push(p);
  }
  return chain;
}

/** mkdir -p with mode 0700, then checks the directory and every parent this call created. */
export async function ensurePrivateDir(path: string): Promise<void> {
  const created = await mkdir(path, { recursive: true, mode: 0o700 });
  for (const p of createdChain(path, created)) assertPrivate(p, await stat(p));
}

export function ensurePrivateDirSync(path: string): string {
  const created = mkdirSync(path, { recursive: true, mode: 0o700 });
  for (const p of createdChain(path, created)) assertPrivate(p, statSync(p));
  return path;
}
