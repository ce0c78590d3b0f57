import { once } from 'node:events';
import { before, after } from 'node:test';
import { Etcd3 } from 'etcd3';
import { ETCD_PREFIX } from '../../src/discovery/etcd.js';
import { startEtcd, type EtcdServer } from './etcd.js';
import { bounded, spawnWorker, startFrontend, workerReady, type EbbProcess, type FrontendHandle, type WorkerHandle } from './processes.js';

/** One etcd per describe block, a raw client to read it, and the processes started against it, all torn down in after(). */
export function etcdFixture() {
  const fx = {
    etcd: undefined as unknown as EtcdServer,
    raw: undefined as unknown as Etcd3,
    started: [] as EbbProcess[],
    /** Kept before it is ready: one that never gets there (a loaded machine) is still stopped in after(). */
    async worker(args: string[]): Promise<WorkerHandle> {
      const p = spawnWorker(['--discovery', fx.etcd.url, ...args]);
      fx.started.push(p);
      return workerReady(p);
    },
    async frontend(): Promise<FrontendHandle> {
      const f = await startFrontend(fx.etcd.url);
      fx.started.push(f);
      return f;
    },
    /** The keys (and values) of one model's workers, read straight from etcd. */
    async keyedIds(model: string): Promise<Record<string, string>> {
      return fx.raw.getAll().prefix(`${ETCD_PREFIX}${encodeURIComponent(model)}/`).strings();
    },
    /** Resolves once etcd holds (or no longer holds) `key`; bounded, naming the key. */
    async keyIs(key: string, present: boolean): Promise<void> {
      const watcher = await fx.raw.watch().key(key).create(); // before the read: no change falls between
      try {
        if (((await fx.raw.get(key).string()) !== null) !== present) await bounded(once(watcher, present ? 'put' : 'delete'), `etcd ${present ? 'to hold' : 'to drop'} ${key}`);
      } finally {
        await watcher.cancel();
      }
    },
    /** Every registered worker id, of any model, read straight from etcd. */
    async registeredIds(): Promise<string[]> {
      return Object.keys(await fx.raw.getAll().prefix(ETCD_PREFIX).strings()).map((k) => decodeURIComponent(k.slice(k.lastIndexOf('/') + 1)));
    },
  };
  before(async () => {
    fx.etcd = await startEtcd();
    fx.raw = new Etcd3({ hosts: [fx.etcd.endpoint] });
  });
  after(async () => {
    await Promise.all(fx.started.map((p) => p.stop()));
    fx.raw?.close();
    await fx.etcd?.stop();
  });
  return fx;
}
