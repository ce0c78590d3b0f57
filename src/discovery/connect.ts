import { mkdtempSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Discovery, DiscoveryOptions } from './discovery.js';
import { FileDiscovery } from './file.js';
import { MemoryDiscovery } from './memory.js';
import { discoveryBaseDir, ensurePrivateDirSync } from './private-dir.js';

/** A fresh directory for `ebb up` and tests, in this user's private base (mkdtemp makes it 0700). */
export function temporaryDiscoveryUrl(): string {
  return `file://${mkdtempSync(join(ensurePrivateDirSync(discoveryBaseDir()), 'discovery-'))}`;
}

/** memory: | file:///dir | etcd://host:2379[,host:2379] */
export async function connectDiscovery(url: string, opts: DiscoveryOptions = {}): Promise<Discovery> {
  if (url === 'memory:' || url === 'memory://') return new MemoryDiscovery();
  if (url.startsWith('file://')) return new FileDiscovery(fileURLToPath(url), opts.leaseTtlMs);
  if (url.startsWith('etcd://')) {
    const { EtcdDiscovery } = await import('./etcd.js');
    return EtcdDiscovery.connect(url, opts);
  }
  throw new Error(`unsupported discovery URL "${url}": use memory:, file:///path/dir or etcd://host:2379`);
}
