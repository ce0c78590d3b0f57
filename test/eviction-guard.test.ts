/**
 * `ebb eviction-guard` as the API server sees it: a real guard process over TLS made here, called
 * with AdmissionReview v1 bodies as the API server sends them for `pods/eviction`, reading and
 * annotating pods on the in-test API server, where a real worker follows its own pod
 * (--k8s-self-pod) and reports its state. One fleet (guard, worker, frontend) for every case.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync } from 'node:fs';
import { request } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { TLSSocket } from 'node:tls';
import { call } from './helpers/http.js';
import { annotations, APP, NS, podWorker, startKube, stateIs } from './helpers/k8s-fixture.js';
import type { FakeKubeApiServer } from './helpers/kube-apiserver.js';
import { skipWithout } from './helpers/required-tool.js';
import { spawnEbb, startFrontend, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { makeCert, OPENSSL, type TestCert } from './helpers/tls.js';
import { createPodApi, loadKubeConfig } from '../src/k8s/client.js';

const PATH = '/validate/pods-eviction';

interface Answer {
  status: number;
  body: { response?: { uid: string; allowed: boolean; status?: { code: number; reason: string; message: string } }; error?: { code: string; message: string }; apiVersion?: string; kind?: string };
  fingerprint: string;
}

/** The client certificate the API server presents (its AdmissionConfiguration kubeconfig), or none. */
type ClientCert = { cert: string; key: string } | null;

/**
 * POST to the guard over TLS, trusting only `ca` (as the API server trusts the webhook's caBundle)
 * and presenting `client` (by default the API server's certificate, set in before()).
 */
function post(url: string, ca: string, body: string, path = PATH, client: ClientCert = apiServerCert): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request(`${url}${path}`, { method: 'POST', ca, ...(client ?? {}), headers: { 'content-type': 'application/json' }, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const fingerprint = (res.socket as TLSSocket).getPeerX509Certificate?.()?.fingerprint256 ?? '';
        try {
          resolve({ status: res.statusCode ?? 0, body: JSON.parse(Buffer.concat(chunks).toString('utf8')) as Answer['body'], fingerprint });
        } catch (err) {
          reject(err as Error);
        }
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}

let apiServerCert: ClientCert = null;

let uids = 0;
/** The review the API server sends for `kubectl drain` evicting `name` (policy/v1 Eviction). */
function evictionReview(name: string, opts: { username?: string; dryRun?: boolean; operation?: string; subResource?: string } = {}) {
  return {
    apiVersion: 'admission.k8s.io/v1',
    kind: 'AdmissionReview',
    request: {
      uid: `uid-${++uids}-${name}`,
      kind: { group: 'policy', version: 'v1', kind: 'Eviction' },
      resource: { group: '', version: 'v1', resource: 'pods' },
      subResource: opts.subResource ?? 'eviction',
      requestKind: { group: 'policy', version: 'v1', kind: 'Eviction' },
      requestResource: { group: '', version: 'v1', resource: 'pods' },
      requestSubResource: opts.subResource ?? 'eviction',
      name,
      namespace: NS,
      operation: opts.operation ?? 'CREATE',
      userInfo: { username: opts.username ?? 'kubernetes-admin', groups: ['system:masters', 'system:authenticated'] },
      object: { apiVersion: 'policy/v1', kind: 'Eviction', metadata: { name, namespace: NS, creationTimestamp: null }, deleteOptions: {} },
      oldObject: null,
      dryRun: opts.dryRun ?? false,
      options: { apiVersion: 'meta.k8s.io/v1', kind: 'CreateOptions' },
    },
  };
}

/** A held stream through the frontend: in flight until the test closes it, no clock involved. */
async function heldStream(frontendUrl: string) {
  const abort = new AbortController();
  const res = await fetch(`${frontendUrl}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'm1', stream: true, max_tokens: 1_000_000, messages: [{ role: 'user', content: 'hold' }] }),
    signal: abort.signal,
  });
  assert.equal(res.status, 200);
  const reader = res.body!.getReader();
  await reader.read(); // the worker has admitted it
  const done = (async () => {
    try {
      while (!(await reader.read()).done);
    } catch {
      /* aborted */
    }
  })();
  return {
    close: async () => {
      abort.abort();
      await done;
    },
  };
}

const patchesOf = (kube: FakeKubeApiServer, name: string) => kube.requests.filter((r) => r.method === 'PATCH' && r.path.startsWith(`/api/v1/namespaces/${NS}/pods/${name}`)).length;

describe('ebb eviction-guard (admission webhook for pods/eviction)', { skip: skipWithout(existsSync(OPENSSL), 'openssl is needed to make the webhook certificate') }, () => {
  const procs: EbbProcess[] = [];
  let kube: FakeKubeApiServer;
  let guard: EbbProcess;
  let url: string;
  let dir: string;
  let tls: TestCert;
  let worker: WorkerHandle;
  let fe: FrontendHandle;

  before(async () => {
    let kubeconfig: string;
    ({ kube, kubeconfig } = await startKube());
    dir = mkdtempSync(join(tmpdir(), 'ebb-guard-tls-'));
    tls = makeCert(dir, 'first', 'tls');
    const client = makeCert(dir, 'apiserver-client'); // self-signed: it is its own client CA
    apiServerCert = { cert: client.cert, key: client.key };
    kube.createPod(NS, 'worker-e', APP);
    kube.createPod(NS, 'etcd-0', { app: 'etcd' });
    // Worker pods with nothing in flight, as their workers (or the kubelet) left them.
    kube.createPod(NS, 'worker-failed', APP, { 'ebb.dev/state': 'failed' });
    kube.createPod(NS, 'worker-crashloop', APP, { 'ebb.dev/state': 'serving' });
    kube.createPod(NS, 'worker-going', APP, { 'ebb.dev/state': 'serving' });
    const discovery = tempDiscoveryUrl();
    guard = spawnEbb(['eviction-guard', '--host', '127.0.0.1', '--port', '0', '--tls-cert-file', tls.certFile, '--tls-key-file', tls.keyFile, '--client-ca-file', client.certFile, '--kubeconfig', kubeconfig, '--api-timeout', '2s'], 'eviction-guard');
    procs.push(guard);
    worker = await podWorker(kubeconfig, discovery, 'worker-e', ['--mocker-itl-ms', '20']);
    procs.push(worker);
    fe = await startFrontend(discovery);
    procs.push(fe);
    url = String((await guard.waitForEvent('eviction_guard_ready')).url);
    // The kubelet reports the worker container restarting (CrashLoopBackOff); the other pod is being deleted.
    const api = createPodApi(loadKubeConfig(kubeconfig));
    await api.patch({ namespace: NS, name: 'worker-crashloop' }, { status: { containerStatuses: [{ name: 'worker', ready: false, restartCount: 4, image: 'ebb', imageID: '', state: { waiting: { reason: 'CrashLoopBackOff' } } }] } }, 'merge');
    await api.delete({ namespace: NS, name: 'worker-going' });
    await kube.waitForPod(NS, 'worker-e', stateIs('serving'), 'the worker reports serving');
    await fe.waitForLog((l) => (l.event === 'worker_added' && l.worker_id === 'worker-e') || (l.event === 'discovery_reset' && (l.workers as string[]).includes('worker-e')), 'frontend sees worker-e');
  });
  after(async () => {
    await Promise.all(procs.map((p) => p.stop()));
    await kube?.close();
  });

  it('a review from a caller without the API server\'s client certificate is refused (401, 403) and annotates nothing', async () => {
    const other = makeCert(dir, 'forger'); // a certificate the client CA did not sign
    const patches = patchesOf(kube, 'worker-e');
    for (const [what, client, status, code] of [
      ['no client certificate', null, 401, 'unauthorized'],
      ['a client certificate of another CA', { cert: other.cert, key: other.key }, 403, 'forbidden'],
    ] as const) {
      const a = await post(url, tls.cert, JSON.stringify(evictionReview('worker-e', { username: 'system:serviceaccount:kube-system:cluster-autoscaler' })), PATH, client);
      assert.equal(a.status, status, what);
      assert.equal(a.body.error?.code, code, what);
      assert.equal(a.body.response, undefined, `${what}: no verdict`);
    }
    assert.equal(patchesOf(kube, 'worker-e'), patches, 'the worker pod was not patched');
    assert.equal(annotations(kube.pod(NS, 'worker-e'))['ebb.dev/drain'], undefined, 'worker-e was not annotated');
    assert.equal((await call('GET', `${worker.systemUrl}/engine/status`)).body.state, 'serving', 'worker-e still serves');
  });

  it('a non-ebb pod, a dry run, other operations, and worker pods with nothing in flight (failed, not running, terminating) are allowed untouched', async () => {
    const patches = patchesOf(kube, 'worker-e');
    for (const [what, review] of [
      ['a pod with no ebb worker', evictionReview('etcd-0')],
      ['a dry-run eviction of a serving worker', evictionReview('worker-e', { dryRun: true })],
      ['an UPDATE', evictionReview('worker-e', { operation: 'UPDATE' })],
      ['another subresource', evictionReview('worker-e', { subResource: 'status' })],
      ['a pod that does not exist', evictionReview('gone-0')],
      ['a worker pod whose worker failed', evictionReview('worker-failed')],
      ['a worker pod whose container is not running', evictionReview('worker-crashloop')],
      ['a worker pod already terminating', evictionReview('worker-going')],
    ] as const) {
      const a = await post(url, tls.cert, JSON.stringify(review));
      assert.equal(a.status, 200, what);
      assert.deepEqual(a.body, { apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', response: { uid: review.request.uid, allowed: true } }, what);
    }
    for (const name of ['etcd-0', 'worker-failed', 'worker-going']) assert.equal(patchesOf(kube, name), 0, `${name} was not annotated`);
    assert.equal(annotations(kube.pod(NS, 'worker-crashloop'))['ebb.dev/drain'], undefined, 'worker-crashloop was not annotated');
    assert.equal(patchesOf(kube, 'worker-e'), patches, 'the worker pod was not annotated');
    assert.equal(annotations(kube.pod(NS, 'worker-e'))['ebb.dev/drain'], undefined);
  });

  it('a malformed review gets a 400 with a JSON error', async () => {
    for (const body of ['{not json', JSON.stringify({ apiVersion: 'admission.k8s.io/v1beta1', kind: 'AdmissionReview', request: evictionReview('worker-e').request }), JSON.stringify({ apiVersion: 'admission.k8s.io/v1', kind: 'AdmissionReview', request: { operation: 'CREATE' } })]) {
      const a = await post(url, tls.cert, body);
      assert.equal(a.status, 400, body);
      assert.equal(a.body.error?.code, 'invalid_request', body);
    }
    assert.equal(annotations(kube.pod(NS, 'worker-e'))['ebb.dev/drain'], undefined, 'nothing was annotated');
  });

  it('a serving worker is annotated for drain and its eviction refused (429) until it reports drained; then allowed', async () => {
    const stream = await heldStream(fe.url);
    const first = evictionReview('worker-e', { username: 'system:serviceaccount:kube-system:cluster-autoscaler' });
    const refused = await post(url, tls.cert, JSON.stringify(first));
    assert.equal(refused.status, 200);
    assert.equal(refused.body.response?.uid, first.request.uid, 'the uid is echoed');
    assert.equal(refused.body.response?.allowed, false);
    assert.equal(refused.body.response?.status?.code, 429, 'kubectl drain retries a 429');
    assert.equal(refused.body.response?.status?.reason, 'TooManyRequests');
    assert.match(refused.body.response?.status?.message ?? '', /worker-e is serving: eviction refused until it has drained/);
    const a = annotations(kube.pod(NS, 'worker-e'));
    assert.equal(a['ebb.dev/drain'], 'true');
    assert.match(String(a['ebb.dev/drain-reason']), /eviction of pod ebb\/worker-e requested by system:serviceaccount:kube-system:cluster-autoscaler/);

    // The worker follows the annotation; the held stream keeps it draining, and the eviction refused.
    await kube.waitForPod(NS, 'worker-e', stateIs('draining'), 'the worker drains on the annotation');
    const again = await post(url, tls.cert, JSON.stringify(evictionReview('worker-e')));
    assert.equal(again.body.response?.allowed, false, 'still refused while a stream runs');
    assert.match(again.body.response?.status?.message ?? '', /is draining/);
    assert.match(String(annotations(kube.pod(NS, 'worker-e'))['ebb.dev/drain-reason']), /cluster-autoscaler/, 'the first drain reason stands');

    await stream.close();
    await kube.waitForPod(NS, 'worker-e', stateIs('drained'), 'the worker reports drained once its stream ended');
    const last = evictionReview('worker-e');
    const allowed = await post(url, tls.cert, JSON.stringify(last));
    assert.deepEqual(allowed.body.response, { uid: last.request.uid, allowed: true });
  });

  it('a worker resumed through its Admin API under a standing drain annotation is drained again by the next eviction', async () => {
    // The annotation stays; the worker acts on changes of it only, so the guard must make one.
    assert.equal((await call('POST', `${worker.systemUrl}/engine/resume`)).status, 200);
    await kube.waitForPod(NS, 'worker-e', stateIs('serving'), 'the worker reports serving again');
    const before = annotations(kube.pod(NS, 'worker-e'));
    assert.equal(before['ebb.dev/drain'], 'true', 'the drain annotation still stands');
    // The same requester as the first time: the rewrite must still be a change the worker sees.
    const refused = await post(url, tls.cert, JSON.stringify(evictionReview('worker-e', { username: 'system:serviceaccount:kube-system:cluster-autoscaler' })));
    assert.equal(refused.body.response?.allowed, false);
    const reason = String(annotations(kube.pod(NS, 'worker-e'))['ebb.dev/drain-reason']);
    assert.match(reason, /requested by system:serviceaccount:kube-system:cluster-autoscaler at /);
    assert.notEqual(reason, before['ebb.dev/drain-reason'], 'the annotation changed');
    await kube.waitForPod(NS, 'worker-e', stateIs('drained'), 'the worker drains again');
    assert.equal((await post(url, tls.cert, JSON.stringify(evictionReview('worker-e')))).body.response?.allowed, true);
  });

  it('a renewed certificate is served without a restart', async () => {
    const cursor = { after: guard.mark() };
    const next = makeCert(dir, 'second', 'tls');
    await guard.waitForEvent('tls_reloaded', () => true, cursor);
    const a = await post(url, next.cert, JSON.stringify(evictionReview('etcd-0')));
    assert.equal(a.fingerprint, next.fingerprint);
    assert.equal(a.body.response?.allowed, true);
    await assert.rejects(post(url, tls.cert, JSON.stringify(evictionReview('etcd-0'))), 'the old CA no longer verifies it');
    tls = next;
  });

  it('when the API server cannot be read, an eviction is refused (429, fail closed) rather than let through unseen', async () => {
    kube.setAvailable(false);
    try {
      const a = await post(url, tls.cert, JSON.stringify(evictionReview('worker-e')));
      assert.equal(a.body.response?.allowed, false);
      assert.equal(a.body.response?.status?.code, 429);
      assert.match(a.body.response?.status?.message ?? '', /cannot read the pod/);
    } finally {
      kube.setAvailable(true);
    }
  });
});
