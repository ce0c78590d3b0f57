import { hostname } from 'node:os';
import { join } from 'node:path';
import { link, open, readFile, rename, unlink } from 'node:fs/promises';
import type { Etcd3 } from 'etcd3';
import { ensurePrivateDir } from './private-dir.js';

/**
 * One scale-down of a model at a time, across every `ebb scale-down` and frontend that share a
 * discovery: held while the victims are chosen and their drains sent, so the next one ranks what
 * is still serving (two at once could name the same victim, or each leave "one serving worker" by
 * its own count and together drain the pool). It lives in discovery because that is the one thing
 * they all share without a frontend; a holder that dies releases it (etcd: its lease expires;
 * file: its pid is gone, same machine by construction).
 */
export interface ScaleDownLocks {
  /** The release, or ScaleDownLockHeld naming the holder. `holder` says who, for that message. */
  acquire(model: string, holder: string): Promise<() => Promise<void>>;
}

export class ScaleDownLockHeld extends Error {
  constructor(
    readonly model: string,
    readonly holder: string,
  ) {
    super(`a scale-down of ${model} is choosing and draining its victims (${holder}); retry when it has`);
  }
}

/** Who takes the lock, in its messages: this process. */
export const lockHolder = (what: string): string => `${what}, pid ${process.pid} on ${hostname()}`;

/** In-process (memory: discovery). */
export class MemoryScaleDownLocks implements ScaleDownLocks {
  private readonly held = new Map<string, string>();

  async acquire(model: string, holder: string): Promise<() => Promise<void>> {
    const by = this.held.get(model);
    if (by !== undefined) throw new ScaleDownLockHeld(model, by);
    this.held.set(model, holder);
    return async () => void this.held.delete(model);
  }
}

interface FileLockBody {
  pid: number;
  holder: string;
}

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
};

/**
 * file: discovery: a lock file created exclusively (O_EXCL) in the discovery directory. One whose
 * pid is dead is stale: it is moved aside (rename is atomic, so of two takers one moves it) and
 * checked to be the stale one; a live lock moved aside by a racing taker is linked back.
 */
export class FileScaleDownLocks implements ScaleDownLocks {
  constructor(private readonly dir: string) {}

  async acquire(model: string, holder: string): Promise<() => Promise<void>> {
    await ensurePrivateDir(this.dir);
    const path = join(this.dir, `.scale-down.${encodeURIComponent(model)}.lock`);
    const body: FileLockBody = { pid: process.pid, holder };
    for (let attempt = 0; attempt < 3; attempt++) {
      try {
        const fh = await open(path, 'wx', 0o600);
        await fh.writeFile(JSON.stringify(body));
        await fh.close();
        return async () => {
          const now = await readBody(path);
          if (now?.pid === process.pid) await unlink(path).catch(() => undefined);
        };
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      }
      const held = await readBody(path);
      if (held === undefined) continue; // released meanwhile
      if (alive(held.pid)) throw new ScaleDownLockHeld(model, held.holder);
      const aside = `${path}.${process.pid}.stale`;
      try {
        await rename(path, aside);
      } catch {
        continue; // another taker moved it first
      }
      const moved = await readBody(aside);
      if (moved !== undefined && moved.pid !== held.pid && alive(moved.pid)) {
        // A live lock taken between our read and our rename: put it back (link fails if yet another exists).
        await link(aside, path).catch(() => undefined);
        await unlink(aside).catch(() => undefined);
        throw new ScaleDownLockHeld(model, moved.holder);
      }
      await unlink(aside).catch(() => undefined);
    }
    throw new ScaleDownLockHeld(model, 'the lock file keeps changing hands');
  }
}

async function readBody(path: string): Promise<FileLockBody | undefined> {
  try {
    const v = JSON.parse(await readFile(path, 'utf8')) as Partial<FileLockBody>;
    return { pid: typeof v.pid === 'number' ? v.pid : -1, holder: typeof v.holder === 'string' ? v.holder : 'unknown holder' };
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    // Half written (the taker is between create and write) or garbage: treat as held by a live taker.
    return { pid: process.pid, holder: 'a taker writing the lock file' };
  }
}

export const SCALE_DOWN_LOCK_PREFIX = '/ebb/v1/locks/scale-down/';
/** The lock's lease: kept alive while held; a holder that dies frees it this long after. */
const LOCK_TTL_S = 10;

/** etcd: a key created only if absent (a transaction on its create revision), bound to a kept-alive lease. */
export class EtcdScaleDownLocks implements ScaleDownLocks {
  constructor(private readonly client: Etcd3) {}

  async acquire(model: string, holder: string): Promise<() => Promise<void>> {
    const key = `${SCALE_DOWN_LOCK_PREFIX}${encodeURIComponent(model)}`;
    const lease = this.client.lease(LOCK_TTL_S);
    try {
      const id = await lease.grant();
      const res = await this.client.if(key, 'Create', '==', 0).then(this.client.put(key).value(holder).lease(id)).else(this.client.get(key)).commit();
      if (!res.succeeded) {
        const kv = res.responses[0]?.response_range?.kvs[0];
        throw new ScaleDownLockHeld(model, kv ? kv.value.toString() : 'a holder that just released it');
      }
    } catch (err) {
      await lease.revoke().catch(() => undefined);
      throw err;
    }
    return () => lease.revoke().catch(() => undefined);
  }
}
