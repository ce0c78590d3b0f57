import { existsSync, readFileSync } from 'node:fs';
import { ApiException, AppsV1Api, CoreV1Api, KubeConfig, PatchStrategy, setHeaderOptions, Watch, type V1Node, type V1ObjectMeta, type V1Pod } from '@kubernetes/client-node';

/**
 * The few Pod operations ebb needs, typed, over @kubernetes/client-node: where the credentials come
 * from (in-cluster service account, --kubeconfig, KUBECONFIG / ~/.kube/config) and a bound on every
 * call, so a hung API server is an error and never a hung worker.
 */

export type { V1Node, V1Pod };

/** What a list+watch needs of an object: its metadata (name, resourceVersion). */
export interface KubeObject {
  metadata?: V1ObjectMeta | undefined;
}

export interface PodRef {
  namespace: string;
  name: string;
}

export const podLabel = (ref: PodRef): string => `${ref.namespace}/${ref.name}`;

export type PatchKind = 'merge' | 'strategic-merge';

export interface PodList<T extends KubeObject = V1Pod> {
  items: T[];
  resourceVersion: string;
}

export interface WatchQuery {
  resourceVersion: string;
  labelSelector?: string | undefined;
  fieldSelector?: string | undefined;
  /** The server ends the watch after this long; the client then re-watches from where it was. */
  timeoutSeconds: number;
}

/** One line of a watch stream: ADDED / MODIFIED / DELETED carry the object; BOOKMARK only a resourceVersion; ERROR a Status. */
export interface WatchEvent<T extends KubeObject = V1Pod> {
  type: 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK' | 'ERROR';
  object: T & { code?: number; reason?: string; message?: string };
}

/** The list and watch of one kind of object (namespaced or not), which a watcher follows. */
export interface ListWatchApi<T extends KubeObject> {
  readonly server: string;
  list(namespace: string, selectors?: { labelSelector?: string | undefined; fieldSelector?: string | undefined }): Promise<PodList<T>>;
  /** Opens a watch; `onDone` is called once, when it ends for any reason (an error, or null for a clean close). */
  watch(namespace: string, query: WatchQuery, onEvent: (e: WatchEvent<T>) => void, onDone: (err: Error | null) => void): Promise<{ abort(): void }>;
}

/** An API answer that was not 2xx: `code` is the HTTP status (409 Conflict, 410 Gone, 404...). */
export class KubeError extends Error {
  constructor(
    readonly code: number | undefined,
    message: string,
  ) {
    super(message);
  }
}

export interface PodApi extends ListWatchApi<V1Pod> {
  /** Where the API server is, for messages. */
  readonly server: string;
  get(ref: PodRef): Promise<V1Pod>;
  patch(ref: PodRef, body: object, kind: PatchKind): Promise<V1Pod>;
  /** With `resourceVersion`: only that version of the pod (DeleteOptions.preconditions; 409 Conflict if it changed). */
  delete(ref: PodRef, resourceVersion?: string): Promise<void>;
}

/** Bound on one API call (not on a watch, which is long by design). */
const CALL_TIMEOUT_MS = 10_000;

const SERVICE_ACCOUNT_NAMESPACE = '/var/run/secrets/kubernetes.io/serviceaccount/namespace';

/** Credentials: --kubeconfig, else in-cluster when running in a Pod, else KUBECONFIG / ~/.kube/config. */
export function loadKubeConfig(kubeconfig?: string): KubeConfig {
  const kc = new KubeConfig();
  if (kubeconfig !== undefined) kc.loadFromFile(kubeconfig);
  else if (process.env.KUBERNETES_SERVICE_HOST !== undefined) kc.loadFromCluster();
  else kc.loadFromDefault();
  if (kc.getCurrentCluster() === null) throw new Error(`no Kubernetes cluster configured (${kubeconfig ?? 'in-cluster, KUBECONFIG or ~/.kube/config'})`);
  return kc;
}

/** The namespace when none is given: the kubeconfig context's, the service account's, else "default". */
export function defaultNamespace(kc: KubeConfig): string {
  const fromContext = kc.getContextObject(kc.getCurrentContext())?.namespace;
  if (fromContext) return fromContext;
  if (existsSync(SERVICE_ACCOUNT_NAMESPACE)) return readFileSync(SERVICE_ACCOUNT_NAMESPACE, 'utf8').trim();
  return 'default';
}

function bounded<T>(p: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout;
  const limit = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new KubeError(undefined, `${what}: no answer within ${CALL_TIMEOUT_MS} ms`)), CALL_TIMEOUT_MS);
  });
  return Promise.race([p, limit]).finally(() => clearTimeout(timer));
}

/** One line: "PATCH pod ns/x: HTTP 409: Operation cannot be fulfilled ...". */
function kubeError(err: unknown, what: string): KubeError {
  if (err instanceof KubeError) return err;
  if (err instanceof ApiException) {
    let message = '';
    try {
      const body = (typeof err.body === 'string' ? JSON.parse(err.body) : err.body) as { message?: string } | undefined;
      message = body?.message ?? '';
    } catch {
      message = String(err.body).slice(0, 200);
    }
    return new KubeError(err.code, `${what}: HTTP ${err.code}${message ? `: ${message}` : ''}`);
  }
  return new KubeError(undefined, `${what}: ${(err as Error).message}`);
}

/** One API call: bounded, and any failure turned into a KubeError naming what was asked. */
async function call<T>(what: string, op: () => Promise<T>): Promise<T> {
  try {
    return await bounded(op(), what);
  } catch (err) {
    throw kubeError(err, what);
  }
}

export function createPodApi(kc: KubeConfig): PodApi {
  const core = kc.makeApiClient(CoreV1Api);
  const watcher = new Watch(kc);
  const server = kc.getCurrentCluster()?.server ?? '(unknown)';
  return {
    server,
    get: (ref) => call(`GET pod ${podLabel(ref)}`, () => core.readNamespacedPod(ref)),
    list: (namespace, selectors = {}) =>
      call(`LIST pods in ${namespace}`, async () => {
        const list = await core.listNamespacedPod({ namespace, ...selectors });
        return { items: list.items, resourceVersion: list.metadata?.resourceVersion ?? '' };
      }),
    patch: (ref, body, kind) =>
      call(`PATCH pod ${podLabel(ref)}`, () =>
        core.patchNamespacedPod({ ...ref, body }, setHeaderOptions('Content-Type', kind === 'merge' ? PatchStrategy.MergePatch : PatchStrategy.StrategicMergePatch)),
      ),
    delete: async (ref, resourceVersion) => {
      await call(`DELETE pod ${podLabel(ref)}`, () => core.deleteNamespacedPod({ ...ref, ...(resourceVersion === undefined ? {} : { body: { preconditions: { resourceVersion } } }) }));
    },
    watch: (namespace, query, onEvent, onDone) => watchPath(watcher, `/api/v1/namespaces/${encodeURIComponent(namespace)}/pods`, `pods in ${namespace}`, query, onEvent, onDone),
  };
}

/** One watch of `path` (a collection), its events typed and its end told once. */
async function watchPath<T extends KubeObject>(watcher: Watch, path: string, what: string, query: WatchQuery, onEvent: (e: WatchEvent<T>) => void, onDone: (err: Error | null) => void): Promise<{ abort(): void }> {
  const params: Record<string, string | number | boolean> = { allowWatchBookmarks: true, resourceVersion: query.resourceVersion, timeoutSeconds: query.timeoutSeconds };
  if (query.labelSelector) params.labelSelector = query.labelSelector;
  if (query.fieldSelector) params.fieldSelector = query.fieldSelector;
  const controller = await watcher.watch(
    path,
    params,
    (type: string, object: WatchEvent<T>['object']) => onEvent({ type: type as WatchEvent<T>['type'], object }),
    (err: unknown) => {
      if (err === null || err === undefined) return onDone(null);
      const code = (err as { statusCode?: number }).statusCode;
      const name = (err as { name?: string }).name;
      onDone(name === 'AbortError' ? null : new KubeError(code, `WATCH ${what}: ${code ? `HTTP ${code}` : (err as Error).message}`));
    },
  );
  return { abort: () => controller.abort() };
}

/** Nodes (cluster-scoped: the namespace argument is ignored): a worker follows its own node's taints. */
export interface NodeApi extends ListWatchApi<V1Node> {
  get(name: string): Promise<V1Node>;
}

export function createNodeApi(kc: KubeConfig): NodeApi {
  const core = kc.makeApiClient(CoreV1Api);
  const watcher = new Watch(kc);
  return {
    server: kc.getCurrentCluster()?.server ?? '(unknown)',
    get: (name) => call(`GET node ${name}`, () => core.readNode({ name })),
    list: (_namespace, selectors = {}) =>
      call('LIST nodes', async () => {
        const list = await core.listNode(selectors);
        return { items: list.items, resourceVersion: list.metadata?.resourceVersion ?? '' };
      }),
    watch: (_namespace, query, onEvent, onDone) => watchPath(watcher, '/api/v1/nodes', 'nodes', query, onEvent, onDone),
  };
}

/** A Deployment's scale subresource: what `ebb scale-down --k8s-scale` reads and sets. */
export interface DeploymentScaleApi {
  get(ref: PodRef): Promise<{ replicas: number; resourceVersion: string }>;
  /** Sets spec.replicas, with `resourceVersion` as a precondition (409 Conflict if it moved). */
  set(ref: PodRef, replicas: number, resourceVersion: string): Promise<number>;
}

export function createDeploymentScaleApi(kc: KubeConfig): DeploymentScaleApi {
  const apps = kc.makeApiClient(AppsV1Api);
  return {
    get: (ref) =>
      call(`GET deployment ${podLabel(ref)}/scale`, async () => {
        const s = await apps.readNamespacedDeploymentScale(ref);
        return { replicas: s.spec?.replicas ?? 0, resourceVersion: s.metadata?.resourceVersion ?? '' };
      }),
    set: (ref, replicas, resourceVersion) =>
      call(`PATCH deployment ${podLabel(ref)}/scale`, async () => {
        const s = await apps.patchNamespacedDeploymentScale({ ...ref, body: { metadata: { resourceVersion }, spec: { replicas } } }, setHeaderOptions('Content-Type', PatchStrategy.MergePatch));
        return s.spec?.replicas ?? replicas;
      }),
  };
}
