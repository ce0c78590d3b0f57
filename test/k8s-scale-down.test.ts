import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { annotations, APP, NO_TOKEN, NS, podWorker, startKube, stateIs } from './helpers/k8s-fixture.js';
import type { FakeKubeApiServer, Pod } from './helpers/kube-apiserver.js';
import { call, openLineStream, type OpenStream } from './helpers/http.js';
import { openEventStream } from './helpers/event-stream.js';
import { frontendSeesWorkers, metricValue, runEbb, startFrontend, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';

/**
 * `ebb scale-down --k8s-selector` against the in-test API server, one fleet for every case: four
 * pods of a Deployment, each run by a worker bound to it (worker id = pod name, as the manifests
 * run them); worker-a and worker-d busy with long streams, worker-d unable to ever drain.
 */
const started: EbbProcess[] = [];
let kube: FakeKubeApiServer;
let kubeconfig = '';
let discovery = '';
/** The frontend the first case ranks through (--frontend), which counts the scale-down it reports. */
let fe: FrontendHandle;
let feAdmin = '';
const workers = new Map<string, WorkerHandle>();
const streams: OpenStream[] = [];
const stateAtDelete = new Map<string, unknown>();

after(async () => {
  for (const s of streams) s.abort();
  await Promise.all(started.map((p) => p.stop()));
  await kube?.close();
});

const ebb = (args: string[], boundMs = 60_000) => runEbb(args, NO_TOKEN, boundMs);

const scaleDown = (extra: string[]) => ebb(['scale-down', '--model', 'm1', '--count', '1', '--k8s-selector', 'app=ebb-worker', '--namespace', NS, '--kubeconfig', kubeconfig, '--discovery', discovery, ...extra]);
const deletes = () => kube.requests.filter((r) => r.method === 'DELETE').map((r) => r.path.split('/').pop()?.split('?')[0]);

before(async () => {
  ({ kube, kubeconfig } = await startKube());
  discovery = tempDiscoveryUrl();
  kube.createDeployment(NS, 'ebb-worker', 4);
  // Started in order: worker-d is the youngest.
  for (const name of ['worker-a', 'worker-b', 'worker-c', 'worker-d']) {
    kube.createPod(NS, name, APP);
    const w = await podWorker(kubeconfig, discovery, name, ['--mocker-itl-ms', '20', ...(name === 'worker-d' ? ['--mocker-idleness', 'unknown'] : [])]);
    started.push(w);
    workers.set(name, w);
  }
  for (const name of workers.keys()) await kube.waitForPod(NS, name, stateIs('serving'), 'serving');
  fe = await startFrontend(discovery, ['--admin-port', '0'], NO_TOKEN);
  started.push(fe);
  feAdmin = String((await fe.waitForEvent('frontend_ready')).admin_url);
  await frontendSeesWorkers(fe, 4);
  kube.on('change', (type: string, pod: Pod) => {
    if (type === 'MODIFIED' && pod.metadata.deletionTimestamp && !stateAtDelete.has(pod.metadata.name)) stateAtDelete.set(pod.metadata.name, annotations(pod)['ebb.dev/state']);
  });
  // Longer than any run of this file, however loaded the machine: worker-a must still be busy in the
  // last case (after() cuts both). worker-a's ends first.
  for (const [name, max_tokens] of [['worker-a', 50_000], ['worker-d', 100_000]] as const) {
    const w = workers.get(name) as WorkerHandle;
    await (await openLineStream(`${w.requestUrl}/generate`, { model: 'm1', prompt: 'warm', max_tokens: 3, stream: true })).done;
    const s = await openLineStream(`${w.requestUrl}/generate`, { model: 'm1', prompt: 'p', max_tokens, stream: true });
    streams.push(s);
    await s.first;
  }
});

describe('ebb scale-down --k8s-selector', () => {
  it('--k8s-scale: drains the idle youngest pod, leaves it at the lowest deletion cost and scales the Deployment down by one', async () => {
    const counted = `ebb_frontend_scale_downs_total`;
    assert.equal(await metricValue(fe.url, counted, 'outcome="started",by="k8s"'), 0);
    // Ranked through the frontend instead of discovery: it is told of the scale-down, and counts it.
    const r = await ebb(['scale-down', '--model', 'm1', '--count', '1', '--k8s-selector', 'app=ebb-worker', '--namespace', NS, '--kubeconfig', kubeconfig, '--frontend', feAdmin, '--k8s-scale', 'deployment/ebb-worker', '--json', '--timeout', '30s']);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(await metricValue(fe.url, counted, 'outcome="started",by="k8s"'), 1, 'the frontend counts the Kubernetes scale-down');
    assert.equal(await metricValue(fe.url, counted, 'outcome="started",by="frontend"'), 0, 'not as one of its own route');
    const out = JSON.parse(r.stdout);
    assert.deepEqual(out.victims.map((v: { worker_id: string }) => v.worker_id), ['worker-c'], r.stdout);
    assert.deepEqual(out.ranking.map((v: { worker_id: string }) => v.worker_id), ['worker-c', 'worker-b', 'worker-a', 'worker-d'], 'idle first (youngest first), then the work that ends first');
    assert.deepEqual(out.result, { action: 'scaled', deployment: 'ebb-worker', from: 4, to: 3 });
    assert.equal(kube.replicas(NS, 'ebb-worker'), 3);
    const c = annotations(kube.pod(NS, 'worker-c'));
    assert.equal(c['ebb.dev/state'], 'drained');
    assert.equal(c['controller.kubernetes.io/pod-deletion-cost'], String(-(2 ** 31)));
    for (const name of ['worker-a', 'worker-b', 'worker-d']) {
      const a = annotations(kube.pod(NS, name));
      assert.equal(a['ebb.dev/drain'], undefined, name);
      assert.equal(a['ebb.dev/state'], 'serving', name);
    }
    assert.deepEqual(deletes(), [], 'the ReplicaSet deletes, not ebb');
  });

  it('without --k8s-scale: deletes the drained victim, and only once it is drained', async () => {
    const r = await scaleDown(['--timeout', '30s']);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /worker-b drained and deleted/);
    assert.deepEqual(deletes(), ['worker-b']);
    assert.equal(stateAtDelete.get('worker-b'), 'drained');
    assert.equal((await call('GET', `${workers.get('worker-a')!.systemUrl}/engine/status`)).body.state, 'serving', 'the busy pod was left alone');
  });

  it('rolls back a victim that does not drain: un-annotated, serving, nothing deleted or scaled, exit 2', async () => {
    // worker-d goes idle, so it is the one to take; its engine cannot tell it is idle: it never drains.
    const d = workers.get('worker-d') as WorkerHandle;
    const events = await openEventStream(`${d.systemUrl}/engine/status/events`);
    streams[1]?.abort();
    try {
      await events.waitFor((e) => e.event === 'status' && e.data.inflight_requests === 0, 'worker-d idle');
    } finally {
      events.close();
    }
    const r = await scaleDown(['--k8s-scale', 'deployment/ebb-worker', '--timeout', '1s']);
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /worker-d: draining/);
    assert.match(r.stderr, /rolled back: pod\(s\) worker-d \(ebb\.dev\/state=draining\) did not drain within 1\.0s; every victim was un-annotated/);
    await kube.waitForPod(NS, 'worker-d', (p) => stateIs('serving')(p) && annotations(p)['ebb.dev/drain'] === undefined, 'worker-d resumed');
    assert.equal(kube.replicas(NS, 'ebb-worker'), 3, 'not scaled');
    assert.deepEqual(deletes(), ['worker-b'], 'nothing more deleted');
  });

  // The victim reports drained, and is resumed before the command acts on it: the watch that tells
  // the command "drained" is held until the resume has landed, so the destructive step runs after it.
  for (const scale of [false, true])
    it(`${scale ? '--k8s-scale' : 'delete'}: a victim resumed after it reported drained is neither deleted nor given the lowest deletion cost`, async () => {
      if (!workers.has('worker-e')) {
        kube.createPod(NS, 'worker-e', APP);
        const e = await podWorker(kubeconfig, discovery, 'worker-e', ['--mocker-itl-ms', '20']);
        started.push(e);
        workers.set('worker-e', e);
        await kube.waitForPod(NS, 'worker-e', stateIs('serving'), 'worker-e serving');
      }
      const e = workers.get('worker-e') as WorkerHandle;
      const replicas = kube.replicas(NS, 'ebb-worker');
      kube.holdWatchesFrom((p) => p.metadata.name === 'worker-e' && annotations(p)['ebb.dev/state'] === 'drained');
      const run = scaleDown([...(scale ? ['--k8s-scale', 'deployment/ebb-worker'] : []), '--timeout', '60s']);
      try {
        await kube.waitForPod(NS, 'worker-e', stateIs('drained'), 'worker-e drained (the idle youngest: the victim)', 60_000);
        const resumed = await call('POST', `${e.systemUrl}/engine/resume`);
        assert.equal(resumed.status, 200, JSON.stringify(resumed.body));
        await kube.waitForPod(NS, 'worker-e', stateIs('serving'), 'worker-e reporting serving again');
      } finally {
        kube.releaseWatches();
      }
      const r = await run;
      assert.equal(r.code, 1, r.stderr);
      assert.match(r.stderr, /pod worker-e changed after it reported drained at generation \d+ \(now ebb\.dev\/state=serving/);
      assert.ok(!deletes().includes('worker-e'), `worker-e was deleted: ${deletes().join(', ')}`);
      const a = annotations(kube.pod(NS, 'worker-e'));
      assert.notEqual(a['controller.kubernetes.io/pod-deletion-cost'], String(-(2 ** 31)), 'a serving pod at the lowest deletion cost');
      assert.equal(kube.replicas(NS, 'ebb-worker'), replicas, 'not scaled');
      assert.equal((await call('GET', `${e.systemUrl}/engine/status`)).body.state, 'serving');
    });
});
