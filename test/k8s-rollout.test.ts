import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { annotations, APP, NO_TOKEN, NS, podWorker, startKube, stateIs } from './helpers/k8s-fixture.js';
import type { FakeKubeApiServer, Pod } from './helpers/kube-apiserver.js';
import { runEbb, startFrontend, tempDiscoveryUrl, type EbbProcess, type WorkerHandle } from './helpers/processes.js';
import { streamCompletion, type StreamOutcome } from './helpers/sse.js';

const started: EbbProcess[] = [];
const servers: FakeKubeApiServer[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
  await Promise.all(servers.map((s) => s.close()));
});

const ebb = (args: string[], boundMs = 90_000) => runEbb(args, NO_TOKEN, boundMs);

describe('ebb rollout --k8s-selector', () => {
  it('drains, deletes and replaces 3 pods one at a time under load with 0 failed requests', async () => {
    const { kube, kubeconfig } = await startKube();
    servers.push(kube);
    const discovery = tempDiscoveryUrl();
    const workers = new Map<string, WorkerHandle>();
    const startPod = async (name: string) => {
      kube.createPod(NS, name, APP);
      const w = await podWorker(kubeconfig, discovery, name);
      started.push(w);
      workers.set(name, w);
      return w;
    };
    for (const name of ['worker-a', 'worker-b', 'worker-c']) await startPod(name);
    for (const name of workers.keys()) await kube.waitForPod(NS, name, stateIs('serving'), 'serving');
    // A pod in the namespace the selector does not match: never touched.
    kube.createPod(NS, 'bystander', { app: 'other' }, { 'ebb.dev/state': 'serving' });

    // The cluster's side, as the ReplicaSet and kubelet do it: a pod being deleted no longer counts,
    // so a replacement is created at once; the kubelet runs the preStop hook, then SIGTERM, and
    // the pod is gone once the container exited.
    const deletedInState = new Map<string, unknown>();
    const cluster: Promise<void>[] = [];
    let replacements = 0;
    kube.on('change', (type: string, pod: Pod) => {
      const name = pod.metadata.name;
      if (type !== 'MODIFIED' || !pod.metadata.deletionTimestamp || deletedInState.has(name)) return;
      deletedInState.set(name, annotations(pod)['ebb.dev/state']);
      cluster.push(
        (async () => {
          await startPod(`worker-r${++replacements}`);
          const w = workers.get(name) as WorkerHandle;
          const hook = await ebb(['prestop', '--system-url', w.systemUrl, '--timeout', '30s']);
          assert.equal(hook.code, 0, hook.stderr);
          await w.terminate(20_000);
          kube.finalizeDelete(NS, name);
        })(),
      );
    });

    const fe = await startFrontend(discovery);
    started.push(fe);
    for (const id of workers.keys())
      await fe.waitForLog((l) => (l.event === 'worker_added' && l.worker_id === id) || (l.event === 'discovery_reset' && (l.workers as string[]).includes(id)), `frontend sees ${id}`);

    const outcomes: StreamOutcome[] = [];
    let stop = false;
    const loops = Array.from({ length: 4 }, async (_, i) => {
      while (!stop) outcomes.push(await streamCompletion(fe.url, { model: 'm1', max_tokens: 20, seed: i }));
    });

    const rollout = await ebb(['rollout', '--k8s-selector', 'app=ebb-worker', '--namespace', NS, '--max-unavailable', '1', '--delete-pods', '--kubeconfig', kubeconfig, '--timeout', '60s']);
    const duringRollout = outcomes.length;
    stop = true;
    await Promise.all(loops);
    await Promise.all(cluster);

    assert.equal(rollout.code, 0, `rollout failed: ${rollout.stderr}`);
    assert.match(rollout.stdout, /rollout of pods app=ebb-worker done: 3 pod\(s\)/);
    assert.deepEqual(Object.fromEntries(deletedInState), { 'worker-a': 'drained', 'worker-b': 'drained', 'worker-c': 'drained' }, 'each pod was deleted only once drained');
    const pods = kube.list(NS).filter((p) => p.metadata.labels.app === 'ebb-worker');
    assert.deepEqual(pods.map((p) => p.metadata.name).sort(), ['worker-r1', 'worker-r2', 'worker-r3']);
    assert.ok(pods.every((p) => stateIs('serving')(p)));
    assert.equal(annotations(kube.pod(NS, 'bystander'))['ebb.dev/drain'], undefined);
    const failures = outcomes.filter((o) => o.status !== 200 || !o.done || o.tokens !== 20 || o.error);
    assert.deepEqual(failures, [], 'every request completes with all its tokens');
    assert.ok(duringRollout > 0);
    process.stderr.write(`# rollout: ${outcomes.length} requests, ${failures.length} failed\n${rollout.stderr}`);
  });
});

describe('ebb rollout --k8s-selector, a pod that does not drain', () => {
  it('stops, un-annotates the stuck pod (it resumes) and leaves the rest serving and untouched', async () => {
    const { kube, kubeconfig } = await startKube();
    servers.push(kube);
    const discovery = tempDiscoveryUrl();
    kube.createPod(NS, 'worker-a', APP);
    kube.createPod(NS, 'worker-b', APP);
    // An engine that cannot tell it is idle never reaches drained (fail-closed).
    started.push(await podWorker(kubeconfig, discovery, 'worker-a', ['--mocker-idleness', 'unknown']));
    started.push(await podWorker(kubeconfig, discovery, 'worker-b'));
    for (const name of ['worker-a', 'worker-b']) await kube.waitForPod(NS, name, stateIs('serving'), 'serving');

    const rollout = await ebb(['rollout', '--k8s-selector', 'app=ebb-worker', '--namespace', NS, '--delete-pods', '--kubeconfig', kubeconfig, '--timeout', '1s']);
    assert.equal(rollout.code, 2, rollout.stderr);
    assert.match(rollout.stderr, /pod worker-a did not drain within 1\.0s.*0 of 2 pod\(s\) were rolled/);
    await kube.waitForPod(NS, 'worker-a', (p) => stateIs('serving')(p) && annotations(p)['ebb.dev/drain'] === undefined, 'worker-a resumed, annotation gone');
    const b = kube.pod(NS, 'worker-b');
    assert.equal(annotations(b)['ebb.dev/drain'], undefined);
    assert.ok(stateIs('serving')(b));
    assert.equal(kube.list(NS).length, 2, 'nothing deleted');
    assert.ok(!kube.requests.some((r) => r.method === 'DELETE'));
  });
});
