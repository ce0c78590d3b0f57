import type { IKeyValue } from 'etcd3';
import { parseAnyRecord, type AnyRecord, type WorkerRecord } from './worker-record.js';

/** Every record lives at `<prefix><model>/<worker_id>` (both URI-encoded: model names contain `/`). */
export const ETCD_PREFIX = '/ebb/v1/instances/';

export function etcdKey(record: Pick<WorkerRecord, 'model' | 'worker_id'>): string {
  return `${ETCD_PREFIX}${encodeURIComponent(record.model)}/${encodeURIComponent(record.worker_id)}`;
}

/** The worker id is the key's last segment; undefined for a key that is not ours. */
export function workerIdFromKey(key: string): string | undefined {
  if (!key.startsWith(ETCD_PREFIX)) return undefined;
  const segment = key.slice(key.lastIndexOf('/') + 1);
  if (segment === '') return undefined;
  try {
    return decodeURIComponent(segment);
  } catch {
    return undefined;
  }
}

/** `etcd://host:2379[,host2:2379]` -> `['http://host:2379', 'http://host2:2379']`. */
export function parseEtcdUrl(url: string): string[] {
  if (!url.startsWith('etcd://')) throw new Error(`not an etcd URL: "${url}" (expected etcd://host:2379[,host:2379])`);
  const authority = url.slice('etcd://'.length).replace(/\/.*$/, '');
  const hosts = authority.split(',').map((h) => h.trim());
  if (hosts.length === 0 || hosts.some((h) => h === '')) {
    throw new Error(`no etcd host in "${url}" (expected etcd://host:2379[,host:2379])`);
  }
  return hosts.map((h) => `http://${/:\d+$/.test(h) ? h : `${h}:2379`}`);
}

/** A serving or a loading record; undefined for anything else under the prefix. */
export function parseRecord(kv: IKeyValue): AnyRecord | undefined {
  try {
    return parseAnyRecord(JSON.parse(kv.value.toString('utf8')));
  } catch {
    return undefined; // someone else's junk under our prefix must not break the frontend
  }
}

export function nextRevision(revision: string): string {
  return (BigInt(revision) + 1n).toString();
}
