/**
 * An in-test Kubernetes API server: the part of the core/v1 Pod API that ebb uses, implemented to
 * the API's documented behaviour (https://kubernetes.io/docs/reference/using-api/api-concepts/),
 * so ebb's Kubernetes code is tested as a contract against that behaviour, over real HTTP:
 *
 * - GET a pod; LIST pods with labelSelector (equality and set-based) and fieldSelector
 *   (metadata.name, metadata.namespace); the list carries the collection's resourceVersion.
 * - PATCH with application/merge-patch+json (RFC 7386) or application/strategic-merge-patch+json
 *   (maps merge, null deletes, lists of known patchMergeKey fields merge by key, `$patch: delete`
 *   and `$patch: replace`); a metadata.resourceVersion in the patch is a precondition (409 Conflict);
 *   a patch that changes nothing does not bump the resourceVersion. JSON patch answers 415.
 * - WATCH (?watch=true) from a resourceVersion: events after it; unset means synthetic ADDED for
 *   what exists, then changes. A version older than the retained history gets an ERROR event with
 *   a 410 Expired Status (what the watch cache sends). allowWatchBookmarks gets BOOKMARK events;
 *   timeoutSeconds ends the watch. Objects moving out of (into) a selector arrive as DELETED (ADDED).
 * - DELETE: graceful, as for a pod on a node: deletionTimestamp and deletionGracePeriodSeconds are
 *   set (MODIFIED) and the pod goes (DELETED) when the test, as the kubelet, calls finalizeDelete;
 *   gracePeriodSeconds=0 removes it at once. DeleteOptions.preconditions.resourceVersion (and uid)
 *   that no longer match answer 409 Conflict.
 * - apps/v1 Deployments' scale subresource (GET, merge PATCH of spec.replicas with a resourceVersion
 *   precondition), for deployments the test creates; no ReplicaSet controller acts on it.
 * - Nodes (cluster-scoped): GET one, LIST and WATCH with a metadata.name field selector, as for
 *   pods; the test, as the cluster's controllers, creates them and changes them (a cordon, a taint).
 * - Bearer-token authentication (401 without it).
 *
 * Knobs: dropWatches() cuts every watch connection; compact() forgets the history so older
 * resourceVersions are 410 Gone; bookmark() sends a bookmark now; setAvailable(false) answers 503;
 * holdWatchesFrom(pred) stops delivering watch events from the first change whose pod matches pred
 * (that one included) until releaseWatches(): a watcher that is slow to hear, made to order.
 */
import { EventEmitter } from 'node:events';
import { writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { isDeepStrictEqual } from 'node:util';

export type Json = null | boolean | number | string | Json[] | { [k: string]: Json };
type Obj = { [k: string]: Json };

export interface Pod extends Obj {
  metadata: Obj & { name: string; namespace: string; resourceVersion: string; labels: Obj; annotations: Obj };
}

export type EventType = 'ADDED' | 'MODIFIED' | 'DELETED';

interface HistoryEntry {
  rv: number;
  type: EventType;
  before: Pod | null;
  after: Pod;
}

interface Watch {
  namespace: string;
  matches: (pod: Pod) => boolean;
  bookmarks: boolean;
  res: ServerResponse;
}

/** Fields of a Pod whose lists merge by key under strategic merge patch (the `patchMergeKey` of the Go types). */
const MERGE_KEYS: Record<string, string> = {
  containers: 'name',
  initContainers: 'name',
  ephemeralContainers: 'name',
  volumes: 'name',
  env: 'name',
  volumeMounts: 'mountPath',
  ports: 'containerPort',
  imagePullSecrets: 'name',
  conditions: 'type',
  ownerReferences: 'uid',
  readinessGates: 'conditionType',
};

const clone = <T>(v: T): T => structuredClone(v);
const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

/** RFC 7386 JSON merge patch. */
export function mergePatch(target: Json, patch: Json): Json {
  if (!isObj(patch)) return clone(patch);
  const out: Obj = isObj(target) ? clone(target) : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k] ?? null, v);
  }
  return out;
}

/** Strategic merge patch over the Pod's known merge keys (the subset documented above). */
export function strategicMergePatch(target: Json, patch: Json, field = ''): Json {
  if (Array.isArray(patch)) {
    const key = MERGE_KEYS[field];
    if (key === undefined || !Array.isArray(target)) return clone(patch.filter((p) => !(isObj(p) && p.$patch === 'delete')));
    const out = clone(target);
    for (const item of patch) {
      if (!isObj(item)) throw new BadRequest(`list ${field} merges by ${key}: items must be objects`);
      const at = out.findIndex((o) => isObj(o) && isDeepStrictEqual(o[key], item[key]));
      if (item.$patch === 'delete') {
        if (at >= 0) out.splice(at, 1);
      } else if (at >= 0) out[at] = strategicMergePatch(out[at] as Json, item, '');
      else out.push(strategicMergePatch(null, item, ''));
    }
    return out;
  }
  if (!isObj(patch)) return clone(patch);
  if (patch.$patch === 'replace') {
    const { $patch: _, ...rest } = patch;
    return clone(rest);
  }
  const out: Obj = isObj(target) ? clone(target) : {};
  for (const [k, v] of Object.entries(patch)) {
    if (k.startsWith('$')) {
      if (k === '$patch') continue;
      throw new BadRequest(`unsupported strategic merge patch directive ${k}`);
    }
    if (v === null) delete out[k];
    else out[k] = strategicMergePatch(out[k] ?? null, v, k);
  }
  return out;
}

class BadRequest extends Error {}

type Requirement = (labels: Obj) => boolean;

/** Label selector syntax: `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`, comma-joined. */
export function parseLabelSelector(selector: string): (labels: Obj) => boolean {
  const parts = selector.match(/([^,(]+(\([^)]*\))?)+/g) ?? [];
  const reqs: Requirement[] = parts.map((raw) => {
    const s = raw.trim();
    let m: RegExpExecArray | null;
    if ((m = /^([\w./-]+)\s*(==|=|!=)\s*([\w.-]*)$/.exec(s))) {
      const [, k, op, v] = m as unknown as [string, string, string, string];
      return op === '!=' ? (l) => l[k] !== v : (l) => l[k] === v;
    }
    if ((m = /^([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)$/.exec(s))) {
      const [, k, op, list] = m as unknown as [string, string, string, string];
      const values = new Set(list.split(',').map((x) => x.trim()));
      return op === 'in' ? (l) => typeof l[k] === 'string' && values.has(l[k] as string) : (l) => !(typeof l[k] === 'string' && values.has(l[k] as string));
    }
    if ((m = /^!([\w./-]+)$/.exec(s))) return (l) => !(m![1]! in l);
    if ((m = /^([\w./-]+)$/.exec(s))) return (l) => m![1]! in l;
    throw new BadRequest(`unable to parse requirement: ${s}`);
  });
  return (labels) => reqs.every((r) => r(labels));
}

export function parseFieldSelector(selector: string): (pod: Pod) => boolean {
  const reqs = selector
    .split(',')
    .filter((s) => s.trim() !== '')
    .map((s) => {
      const m = /^\s*(metadata\.name|metadata\.namespace)\s*(==|=|!=)\s*(.*?)\s*$/.exec(s);
      if (!m) throw new BadRequest(`field label not supported: ${s}`);
      const [, field, op, value] = m as unknown as [string, string, string, string];
      const get = (p: Pod) => (field === 'metadata.name' ? p.metadata.name : p.metadata.namespace);
      return op === '!=' ? (p: Pod) => get(p) !== value : (p: Pod) => get(p) === value;
    });
  return (pod) => reqs.every((r) => r(pod));
}

/** An object as the API serves it: a node is cluster-scoped, so it has no namespace. */
function served(object: Json): Json {
  if (!isObj(object) || object.kind !== 'Node' || !isObj(object.metadata)) return object;
  const { namespace: _, ...metadata } = object.metadata;
  return { ...object, metadata };
}

function status(code: number, reason: string, message: string): Obj {
  return { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code };
}

export interface RequestRecord {
  method: string;
  path: string;
  contentType: string | undefined;
  body?: Json;
}

export class FakeKubeApiServer extends EventEmitter {
  readonly token = 'test-token-' + Math.random().toString(36).slice(2);
  readonly requests: RequestRecord[] = [];
  private readonly pods = new Map<string, Pod>();
  private readonly deployments = new Map<string, { replicas: number; rv: number }>();
  private history: HistoryEntry[] = [];
  /** Watches from a resourceVersion below this are 410 Gone. */
  private oldestRetained = 1;
  private rv = 1;
  private readonly watches = new Set<Watch>();
  private available = true;
  private holdWhen: ((pod: Pod) => boolean) | undefined;
  /** Changes not yet delivered to watches (holdWatchesFrom); undefined when delivering. */
  private held: HistoryEntry[] | undefined;
  private server: Server | undefined;
  url = '';

  async start(): Promise<string> {
    this.server = createServer((req, res) => void this.handle(req, res));
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this.url;
  }

  async close(): Promise<void> {
    this.dropWatches();
    this.server?.closeAllConnections();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }

  /** A kubeconfig for this server, as `kubectl config` would write it. */
  writeKubeconfig(dir: string, namespace = 'default'): string {
    const path = join(dir, 'kubeconfig.json');
    writeFileSync(
      path,
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'Config',
        // Plain HTTP in tests: client-node refuses http:// unless TLS verification is declared off.
        clusters: [{ name: 'test', cluster: { server: this.url, 'insecure-skip-tls-verify': true } }],
        users: [{ name: 'test', user: { token: this.token } }],
        contexts: [{ name: 'test', context: { cluster: 'test', user: 'test', namespace } }],
        'current-context': 'test',
      }),
    );
    return path;
  }

  // --- the cluster's own side (what the scheduler, kubelet and controllers would do) ---

  createPod(namespace: string, name: string, labels: Record<string, string> = {}, annotations: Record<string, string> = {}): Pod {
    const key = `${namespace}/${name}`;
    if (this.pods.has(key)) throw new Error(`pod ${key} exists`);
    const pod: Pod = {
      kind: 'Pod',
      apiVersion: 'v1',
      metadata: { name, namespace, uid: `uid-${name}-${this.rv}`, resourceVersion: '', creationTimestamp: new Date().toISOString(), labels: { ...labels }, annotations: { ...annotations } },
      spec: { containers: [{ name: 'worker', image: 'ebb' }], terminationGracePeriodSeconds: 60, nodeName: 'node-1' },
      status: { phase: 'Running' },
    };
    return this.commit('ADDED', null, pod);
  }

  /**
   * A change to a pod as the cluster's own controllers make it (a condition in status, a field of
   * its spec): an RFC 7386 merge patch, so a list (status.conditions) is replaced whole.
   */
  patchPod(namespace: string, name: string, patch: Json): Pod {
    const pod = this.pods.get(`${namespace}/${name}`);
    if (!pod) throw new Error(`no pod ${namespace}/${name}`);
    return this.commit('MODIFIED', pod, mergePatch(pod, patch) as Pod);
  }

  /** A node (cluster-scoped; held beside the pods under namespace "", never served with one). */
  createNode(name: string, spec: Obj = {}): void {
    if (this.pods.has(`/${name}`)) throw new Error(`node ${name} exists`);
    const node: Pod = { kind: 'Node', apiVersion: 'v1', metadata: { name, namespace: '', uid: `uid-node-${name}-${this.rv}`, resourceVersion: '', creationTimestamp: new Date().toISOString(), labels: {}, annotations: {} }, spec: { ...spec }, status: {} };
    this.commit('ADDED', null, node);
  }

  /** A node's change as kubectl cordon / taint, the cluster autoscaler or Karpenter make it (merge patch of the node). */
  patchNode(name: string, patch: Json): void {
    const node = this.pods.get(`/${name}`);
    if (!node) throw new Error(`no node ${name}`);
    this.commit('MODIFIED', node, mergePatch(node, patch) as Pod);
  }

  /** A Deployment, as far as its scale subresource goes. */
  createDeployment(namespace: string, name: string, replicas: number): void {
    this.deployments.set(`${namespace}/${name}`, { replicas, rv: ++this.rv });
  }

  replicas(namespace: string, name: string): number | undefined {
    return this.deployments.get(`${namespace}/${name}`)?.replicas;
  }

  pod(namespace: string, name: string): Pod | undefined {
    const p = this.pods.get(`${namespace}/${name}`);
    return p && clone(p);
  }

  list(namespace: string): Pod[] {
    return [...this.pods.values()].filter((p) => p.metadata.namespace === namespace).map(clone);
  }

  /** The kubelet reports the containers gone: a pod deleted gracefully disappears now. */
  finalizeDelete(namespace: string, name: string): void {
    const pod = this.pods.get(`${namespace}/${name}`);
    if (pod) this.commit('DELETED', pod, pod);
  }

  /** An annotation change as another client (kubectl annotate) would make it. */
  annotate(namespace: string, name: string, annotations: Record<string, string | null>): Pod {
    const pod = this.pods.get(`${namespace}/${name}`);
    if (!pod) throw new Error(`no pod ${namespace}/${name}`);
    return this.commit('MODIFIED', pod, mergePatch(pod, { metadata: { annotations } }) as Pod);
  }

  /** Resolves with the pod once `pred` holds for it (checked now and on every change). */
  waitForPod(namespace: string, name: string, pred: (pod: Pod | undefined) => boolean, what: string, boundMs = 20_000): Promise<Pod | undefined> {
    return new Promise((resolve, reject) => {
      const check = () => {
        const p = this.pod(namespace, name);
        if (!pred(p)) return;
        cleanup();
        resolve(p);
      };
      const timer = setTimeout(() => {
        cleanup();
        reject(new Error(`timed out waiting for pod ${namespace}/${name}: ${what}; now ${JSON.stringify(this.pod(namespace, name)?.metadata.annotations)}`));
      }, boundMs);
      const cleanup = () => {
        clearTimeout(timer);
        this.off('change', check);
      };
      this.on('change', check);
      check();
    });
  }

  // --- knobs ---

  /** Cuts every open watch connection mid-stream, as a load balancer or an API-server restart does. */
  dropWatches(): number {
    const n = this.watches.size;
    for (const w of this.watches) w.res.destroy();
    this.watches.clear();
    return n;
  }

  /** Forgets the event history (etcd compaction): watches from an older resourceVersion are 410 Gone. */
  compact(): void {
    this.history = [];
    this.oldestRetained = this.rv;
  }

  /** Sends a BOOKMARK with the current resourceVersion to every watch that allowed them. */
  bookmark(): void {
    for (const w of this.watches) if (w.bookmarks) this.send(w, 'BOOKMARK', { kind: 'Pod', apiVersion: 'v1', metadata: { resourceVersion: String(this.rv) } });
  }

  /** An outage: every request answers 503 and open watches are cut. */
  setAvailable(available: boolean): void {
    this.available = available;
    if (!available) this.dropWatches();
  }

  /** From the first change whose pod matches `pred` (included), watches hear nothing until releaseWatches(). */
  holdWatchesFrom(pred: (pod: Pod) => boolean): void {
    this.holdWhen = pred;
  }

  /** Delivers what was held, in order, and delivers as it happens again. */
  releaseWatches(): void {
    const held = this.held ?? [];
    this.held = undefined;
    this.holdWhen = undefined;
    for (const e of held) for (const w of this.watches) this.deliver(w, e);
  }

  get watchCount(): number {
    return this.watches.size;
  }

  // --- storage ---

  private commit(type: EventType, before: Pod | null, after: Pod): Pod {
    const key = `${after.metadata.namespace}/${after.metadata.name}`;
    const rv = ++this.rv;
    const stored = clone(after);
    stored.metadata.resourceVersion = String(rv);
    if (type === 'DELETED') this.pods.delete(key);
    else this.pods.set(key, stored);
    const entry = { rv, type, before: before && clone(before), after: stored };
    this.history.push(entry);
    if (this.held === undefined && this.holdWhen?.(stored)) this.held = [];
    if (this.held !== undefined) this.held.push(entry);
    else for (const w of this.watches) this.deliver(w, entry);
    this.emit('change', type, clone(stored));
    return clone(stored);
  }

  /** The event a watch sees: a selector that stops (starts) matching turns MODIFIED into DELETED (ADDED). */
  private deliver(w: Watch, e: HistoryEntry): void {
    if (e.after.metadata.namespace !== w.namespace) return;
    const was = e.before !== null && e.type !== 'ADDED' && w.matches(e.before);
    const is = w.matches(e.after);
    if (e.type === 'DELETED') {
      if (was || is) this.send(w, 'DELETED', e.after);
    } else if (is) this.send(w, was ? 'MODIFIED' : 'ADDED', e.after);
    else if (was) this.send(w, 'DELETED', e.after);
  }

  private send(w: Watch, type: string, object: Json): void {
    w.res.write(JSON.stringify({ type, object: served(object) }) + '\n');
  }

  // --- HTTP ---

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://x');
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const raw = Buffer.concat(chunks).toString('utf8');
    const contentType = req.headers['content-type']?.split(';')[0]?.trim();
    const record: RequestRecord = { method: req.method ?? '', path: url.pathname + url.search, contentType };
    const reply = (code: number, body: Json) => {
      res.writeHead(code, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    };
    try {
      if (raw) record.body = JSON.parse(raw) as Json;
    } catch {
      return reply(400, status(400, 'BadRequest', 'the body is not valid JSON'));
    }
    this.requests.push(record);
    if (req.headers.authorization !== `Bearer ${this.token}`) return reply(401, status(401, 'Unauthorized', 'Unauthorized'));
    if (!this.available) return reply(503, status(503, 'ServiceUnavailable', 'the server is currently unable to handle the request'));
    const nodes = /^\/api\/v1\/nodes(?:\/([^/]+))?$/.exec(url.pathname);
    if (nodes) return this.nodes(nodes[1] === undefined ? undefined : decodeURIComponent(nodes[1]), req.method ?? '', url, res, reply);
    const scale = /^\/apis\/apps\/v1\/namespaces\/([^/]+)\/deployments\/([^/]+)\/scale$/.exec(url.pathname);
    if (scale) return this.scale(decodeURIComponent(scale[1]!), decodeURIComponent(scale[2]!), req.method ?? '', contentType, record.body, reply);
    const m = /^\/api\/v1\/namespaces\/([^/]+)\/pods(?:\/([^/]+))?$/.exec(url.pathname);
    if (!m) return reply(404, status(404, 'NotFound', `the server could not find the requested resource (${url.pathname})`));
    const namespace = decodeURIComponent(m[1]!);
    const name = m[2] === undefined ? undefined : decodeURIComponent(m[2]);
    try {
      if (name === undefined && req.method === 'GET') {
        const matches = this.selectorOf(url);
        if (url.searchParams.get('watch') === 'true' || url.searchParams.get('watch') === '1') return this.watch(namespace, matches, url, res);
        const items = [...this.pods.values()].filter((p) => p.metadata.namespace === namespace && matches(p));
        return reply(200, { kind: 'PodList', apiVersion: 'v1', metadata: { resourceVersion: String(this.rv) }, items });
      }
      if (name === undefined) return reply(405, status(405, 'MethodNotAllowed', `${req.method} is not supported on the collection here`));
      const key = `${namespace}/${name}`;
      const pod = this.pods.get(key);
      const notFound = () => reply(404, status(404, 'NotFound', `pods "${name}" not found`));
      if (req.method === 'GET') return pod ? reply(200, pod) : notFound();
      if (req.method === 'PATCH') {
        if (!pod) return notFound();
        const patch = record.body ?? null;
        let next: Json;
        if (contentType === 'application/merge-patch+json') next = mergePatch(pod, patch);
        else if (contentType === 'application/strategic-merge-patch+json') next = strategicMergePatch(pod, patch);
        else return reply(415, status(415, 'UnsupportedMediaType', `the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json`));
        const wanted = isObj(patch) && isObj(patch.metadata) ? patch.metadata.resourceVersion : undefined;
        if (typeof wanted === 'string' && wanted !== pod.metadata.resourceVersion)
          return reply(409, status(409, 'Conflict', `Operation cannot be fulfilled on pods "${name}": the object has been modified; please apply your changes to the latest version and try again`));
        const np = next as Pod;
        if (!isObj(np) || !isObj(np.metadata) || np.metadata.name !== name || np.metadata.namespace !== namespace) return reply(400, status(400, 'BadRequest', 'metadata.name and metadata.namespace cannot be changed'));
        np.metadata.resourceVersion = pod.metadata.resourceVersion;
        if (isDeepStrictEqual(np, pod)) return reply(200, pod); // a no-op patch is not a new version
        return reply(200, this.commit('MODIFIED', pod, np));
      }
      if (req.method === 'DELETE') {
        if (!pod) return notFound();
        const body = isObj(record.body) ? record.body : {};
        const grace = url.searchParams.get('gracePeriodSeconds') ?? (typeof body.gracePeriodSeconds === 'number' ? String(body.gracePeriodSeconds) : null);
        const pre = isObj(body.preconditions) ? body.preconditions : {};
        if ((typeof pre.resourceVersion === 'string' && pre.resourceVersion !== pod.metadata.resourceVersion) || (typeof pre.uid === 'string' && pre.uid !== pod.metadata.uid))
          return reply(409, status(409, 'Conflict', `Operation cannot be fulfilled on pods "${name}": the object has been modified; please apply your changes to the latest version and try again`));
        if (grace === '0') {
          this.commit('DELETED', pod, pod);
          return reply(200, pod);
        }
        if (pod.metadata.deletionTimestamp) return reply(200, pod);
        const seconds = grace !== null ? Number(grace) : ((pod.spec as Obj | undefined)?.terminationGracePeriodSeconds as number | undefined) ?? 30;
        const next = clone(pod);
        next.metadata.deletionTimestamp = new Date(Date.now() + seconds * 1000).toISOString();
        next.metadata.deletionGracePeriodSeconds = seconds;
        return reply(200, this.commit('MODIFIED', pod, next));
      }
      return reply(405, status(405, 'MethodNotAllowed', `${req.method} is not supported`));
    } catch (err) {
      if (err instanceof BadRequest) return reply(400, status(400, 'BadRequest', err.message));
      throw err;
    }
  }

  private scale(namespace: string, name: string, method: string, contentType: string | undefined, body: Json | undefined, reply: (code: number, body: Json) => void): void {
    const d = this.deployments.get(`${namespace}/${name}`);
    if (!d) return reply(404, status(404, 'NotFound', `deployments.apps "${name}" not found`));
    const answer = () => ({ kind: 'Scale', apiVersion: 'autoscaling/v1', metadata: { name, namespace, resourceVersion: String(d.rv) }, spec: { replicas: d.replicas }, status: { replicas: d.replicas } });
    if (method === 'GET') return reply(200, answer());
    if (method !== 'PATCH') return reply(405, status(405, 'MethodNotAllowed', `${method} is not supported`));
    if (contentType !== 'application/merge-patch+json') return reply(415, status(415, 'UnsupportedMediaType', 'only application/merge-patch+json here'));
    const meta = isObj(body) && isObj(body.metadata) ? body.metadata : {};
    if (typeof meta.resourceVersion === 'string' && meta.resourceVersion !== String(d.rv))
      return reply(409, status(409, 'Conflict', `Operation cannot be fulfilled on deployments.apps "${name}": the object has been modified`));
    const replicas = isObj(body) && isObj(body.spec) ? body.spec.replicas : undefined;
    if (typeof replicas !== 'number' || !Number.isInteger(replicas) || replicas < 0) return reply(422, status(422, 'Invalid', 'spec.replicas: must be a non-negative integer'));
    if (replicas !== d.replicas) {
      d.replicas = replicas;
      d.rv = ++this.rv;
    }
    return reply(200, answer());
  }

  private nodes(name: string | undefined, method: string, url: URL, res: ServerResponse, reply: (code: number, body: Json) => void): void {
    if (method !== 'GET') return reply(405, status(405, 'MethodNotAllowed', `${method} is not supported on nodes here`));
    if (name !== undefined) {
      const node = this.pods.get(`/${name}`);
      return node ? reply(200, served(node)) : reply(404, status(404, 'NotFound', `nodes "${name}" not found`));
    }
    let selected: (pod: Pod) => boolean;
    try {
      selected = this.selectorOf(url);
    } catch (err) {
      if (err instanceof BadRequest) return reply(400, status(400, 'BadRequest', err.message));
      throw err;
    }
    const matches = (p: Pod) => p.kind === 'Node' && selected(p);
    if (url.searchParams.get('watch') === 'true' || url.searchParams.get('watch') === '1') return this.watch('', matches, url, res);
    const items = [...this.pods.values()].filter((p) => p.metadata.namespace === '' && matches(p)).map(served);
    return reply(200, { kind: 'NodeList', apiVersion: 'v1', metadata: { resourceVersion: String(this.rv) }, items });
  }

  private selectorOf(url: URL): (pod: Pod) => boolean {
    const labels = parseLabelSelector(url.searchParams.get('labelSelector') ?? '');
    const fields = parseFieldSelector(url.searchParams.get('fieldSelector') ?? '');
    return (p) => labels(p.metadata.labels ?? {}) && fields(p);
  }

  private watch(namespace: string, matches: (pod: Pod) => boolean, url: URL, res: ServerResponse): void {
    res.writeHead(200, { 'content-type': 'application/json', 'transfer-encoding': 'chunked' });
    res.flushHeaders();
    const w: Watch = { namespace, matches, bookmarks: url.searchParams.get('allowWatchBookmarks') === 'true', res };
    const from = url.searchParams.get('resourceVersion');
    if (from === null || from === '' || from === '0') {
      // "Get State and Start at Most Recent" / "Start at Any": synthetic ADDED for what exists.
      for (const p of this.pods.values()) if (p.metadata.namespace === namespace && matches(p)) this.send(w, 'ADDED', p);
    } else {
      const since = Number(from);
      if (!Number.isInteger(since)) {
        this.send(w, 'ERROR', status(400, 'BadRequest', `invalid resourceVersion ${from}`));
        res.end();
        return;
      }
      if (since < this.oldestRetained) {
        this.send(w, 'ERROR', status(410, 'Expired', `too old resource version: ${since} (${this.oldestRetained})`));
        res.end();
        return;
      }
      for (const e of this.history) if (e.rv > since && !this.held?.includes(e)) this.deliver(w, e);
    }
    this.watches.add(w);
    const timeout = Number(url.searchParams.get('timeoutSeconds') ?? '0');
    const timer = timeout > 0 ? setTimeout(() => res.end(), timeout * 1000) : undefined;
    res.once('close', () => {
      clearTimeout(timer);
      this.watches.delete(w);
    });
  }
}
