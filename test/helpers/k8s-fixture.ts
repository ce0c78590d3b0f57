import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { FakeKubeApiServer, type Pod } from './kube-apiserver.js';
import { startWorker, type WorkerHandle } from './processes.js';

export const NS = 'ebb';
export const APP = { app: 'ebb-worker' };
export const NO_TOKEN = { EBB_ADMIN_TOKEN: undefined };

export const annotations = (p: Pod | undefined): Record<string, unknown> => (p?.metadata.annotations ?? {}) as Record<string, unknown>;
export const stateIs = (state: string) => (p: Pod | undefined) => annotations(p)['ebb.dev/state'] === state;

export async function startKube(): Promise<{ kube: FakeKubeApiServer; kubeconfig: string }> {
  const kube = new FakeKubeApiServer();
  await kube.start();
  return { kube, kubeconfig: kube.writeKubeconfig(mkdtempSync(join(tmpdir(), 'ebb-kube-')), NS) };
}

/** A worker bound to pod `name` as the Deployment runs it: pod name and namespace from the downward API env. */
export async function podWorker(kubeconfig: string, discovery: string, name: string, args: string[] = []): Promise<WorkerHandle> {
  return startWorker(['--discovery', discovery, '--model', 'm1', '--worker-id', name, '--k8s-self-pod', '--kubeconfig', kubeconfig, ...args], { ...NO_TOKEN, POD_NAME: name, POD_NAMESPACE: NS });
}

/** The ebb.dev/state values the worker wrote, in order (from the PATCH requests the server saw). */
export function stateWrites(kube: FakeKubeApiServer, name: string): string[] {
  return kube.requests
    .filter((r) => r.method === 'PATCH' && r.path.startsWith(`/api/v1/namespaces/${NS}/pods/${name}`))
    .map((r) => ((r.body as { metadata?: { annotations?: Record<string, unknown> } })?.metadata?.annotations ?? {})['ebb.dev/state'])
    .filter((s): s is string => typeof s === 'string');
}
