import type { Logger } from 'pino';
import type { Lifecycle } from '../lifecycle/lifecycle.js';
import type { NodeApi, PodApi, PodRef } from '../k8s/client.js';
import type { DisruptionSource, DisruptionSourceName } from './notice.js';
import { NoticeDrain, type NoticeDrainOptions } from './notice-drain.js';

export interface DisruptionOptions extends NoticeDrainOptions {
  sources: DisruptionSourceName[];
  /** AWS and Azure have no push: their endpoints are read this often (--disruption-poll-ms). */
  pollMs: number;
  /** A cordon alone drains (k8s; --disruption-on-cordon). */
  onCordon: boolean;
  /** The k8s source's pod and credentials (--k8s-self-pod). */
  k8s?: { pods: PodApi; nodes: NodeApi; ref: PodRef; nodeName?: string | undefined } | undefined;
}

export interface DisruptionWatch {
  close(): Promise<void>;
}

/** Each source's module, loaded only when named (the Kubernetes client is heavy). */
async function createSource(name: DisruptionSourceName, opts: DisruptionOptions, log: Logger): Promise<DisruptionSource> {
  switch (name) {
    case 'aws':
      return (await import('./aws.js')).awsSource(opts.pollMs, log);
    case 'gcp':
      return (await import('./gcp.js')).gcpSource(log);
    case 'azure':
      return (await import('./azure.js')).azureSource(opts.pollMs, log);
    case 'k8s': {
      if (opts.k8s === undefined) throw new Error('--disruption-source k8s follows the pod of --k8s-self-pod: pass it too');
      return (await import('./k8s.js')).k8sSource({ ...opts.k8s, onCordon: opts.onCordon, log });
    }
  }
}

/**
 * `ebb worker --disruption-source ...`: the sources, each reporting its notices to one NoticeDrain
 * that drains the worker. Once the worker shuts down (SIGTERM, its engine failed) the notices have
 * nothing left to drain: the sources stop.
 */
export async function watchDisruptions(lifecycle: Lifecycle, opts: DisruptionOptions, log: Logger): Promise<DisruptionWatch> {
  const drain = new NoticeDrain(lifecycle, opts, log);
  const sources = await Promise.all([...new Set(opts.sources)].map((name) => createSource(name, opts, log.child({ disruption_source: name }))));
  let closing: Promise<void> | undefined;
  const close = () =>
    (closing ??= (async () => {
      drain.close();
      await Promise.all(sources.map((s) => s.close()));
    })());
  lifecycle.on('transition', () => {
    if (lifecycle.isShuttingDown) void close();
  });
  for (const s of sources) s.start((notices) => drain.report(s.name, notices));
  log.info({ event: 'disruption_sources', sources: sources.map((s) => s.name), margin_ms: opts.marginMs, lead_ms: opts.leadMs }, `following disruption notices from ${sources.map((s) => s.name).join(', ')}`);
  return { close };
}
