import type { Logger } from 'pino';
import { K8sError } from './k8s-error.js';
import type { Lifecycle } from '../lifecycle/lifecycle.js';
import type { DrainIntent } from './annotations.js';
import type { KubeConfig } from '@kubernetes/client-node';
import { createNodeApi, createPodApi, defaultNamespace, loadKubeConfig, podLabel, type NodeApi, type PodApi, type PodRef } from './client.js';
import { readSelfPod, SelfPodController } from './self-pod-controller.js';

/** What `ebb worker --k8s-self-pod` found before the worker started. */
export interface SelfPodSetup {
  api: PodApi;
  ref: PodRef;
  intent: DrainIntent | null;
  /** The credentials it was read with: `--disruption-source k8s` follows the pod's node with them too. */
  kubeConfig: KubeConfig;
}

/**
 * `--k8s-self-pod [namespace/name]`: the pod from the flag, else from the downward API env
 * (POD_NAMESPACE, POD_NAME); then its drain intent, read before the worker registers.
 */
export async function resolveSelfPod(flag: string | boolean, kubeconfig: string | undefined): Promise<SelfPodSetup> {
  let api: PodApi;
  let kc: KubeConfig;
  let namespace: string | undefined;
  let name: string | undefined;
  try {
    kc = loadKubeConfig(kubeconfig);
    api = createPodApi(kc);
    if (typeof flag === 'string') [namespace, name] = flag.includes('/') ? flag.split('/', 2) : [undefined, flag];
    name ||= process.env.POD_NAME;
    namespace ||= process.env.POD_NAMESPACE || defaultNamespace(kc);
  } catch (err) {
    throw new K8sError(`--k8s-self-pod: ${(err as Error).message}`);
  }
  if (!name) throw new K8sError('--k8s-self-pod: no pod name (pass namespace/name, or set POD_NAME from the downward API: fieldRef metadata.name)');
  const ref = { namespace, name };
  try {
    const { intent } = await readSelfPod(api, ref);
    return { api, ref, intent, kubeConfig: kc };
  } catch (err) {
    throw new K8sError(`--k8s-self-pod: ${(err as Error).message}`);
  }
}

/** Once the worker runs: follow the pod's annotations and write the state back. */
export async function attachSelfPod(setup: SelfPodSetup, lifecycle: Lifecycle, log: Logger): Promise<SelfPodController> {
  const controller = new SelfPodController(setup.api, setup.ref, lifecycle, setup.intent, log.child({ pod: podLabel(setup.ref) }));
  await controller.start();
  log.info({ event: 'k8s_self_pod_watching', pod: podLabel(setup.ref), server: setup.api.server }, `following pod ${podLabel(setup.ref)} at ${setup.api.server}`);
  return controller;
}

/** The nodes API with the pod's credentials (the node's taints announce its removal). */
export function nodeApiOf(setup: SelfPodSetup): NodeApi {
  return createNodeApi(setup.kubeConfig);
}
