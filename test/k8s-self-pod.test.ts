import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { pino } from 'pino';
import { call } from './helpers/http.js';
import { annotations, APP, NO_TOKEN, NS, podWorker, startKube, stateIs, stateWrites } from './helpers/k8s-fixture.js';
import type { FakeKubeApiServer } from './helpers/kube-apiserver.js';
import { bounded, CLI, startFrontend, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type LogCursor, type WorkerHandle } from './helpers/processes.js';
import { dieWithFile } from './helpers/reaper.js';
import { createPodApi, loadKubeConfig } from '../src/k8s/client.js';
import { updateAnnotations } from '../src/k8s/pod-patcher.js';

const started: EbbProcess[] = [];
const servers: FakeKubeApiServer[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
  await Promise.all(servers.map((s) => s.close()));
});

const LOW = String(-(2 ** 31));

async function setup() {
  const { kube, kubeconfig } = await startKube();
  servers.push(kube);
  return { kube, kubeconfig, discovery: tempDiscoveryUrl() };
}

/** The frontend has the worker in its pool (added later, or there at its first discovery read). */
const sees = (fe: EbbProcess, id: string, cursor: LogCursor = {}) =>
  fe.waitForLog((l) => (l.event === 'worker_added' && l.worker_id === id) || (l.event === 'discovery_reset' && (l.workers as string[]).includes(id)), `frontend sees ${id}`, cursor);

/** Pod worker-c (20 ms a token) behind a frontend: shared by the outage test and then the prestop test. */
let podFleet: Promise<{ kube: FakeKubeApiServer; w: WorkerHandle; fe: FrontendHandle }> | undefined;
function podBehindFrontend() {
  return (podFleet ??= (async () => {
    const { kube, kubeconfig, discovery } = await setup();
    kube.createPod(NS, 'worker-c', APP);
    const w = await podWorker(kubeconfig, discovery, 'worker-c', ['--mocker-itl-ms', '20']);
    started.push(w);
    const fe = await startFrontend(discovery);
    started.push(fe);
    await sees(fe, 'worker-c');
    return { kube, w, fe };
  })());
}

const status = async (systemUrl: string) => (await call('GET', `${systemUrl}/engine/status`)).body;

/** A stream the test holds open until it aborts it: in flight for as long as the test says, no clock involved. */
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
  await reader.read(); // the first chunk: the worker has admitted it
  const drained = (async () => {
    try {
      while (!(await reader.read()).done);
    } catch {
      /* aborted */
    }
  })();
  return {
    close: async () => {
      abort.abort();
      await drained;
    },
  };
}

describe('worker --k8s-self-pod', () => {
  it('annotate -> drained with state and deletion cost written; un-annotate -> serving with the cost restored', async () => {
    const { kube, kubeconfig, discovery } = await setup();
    kube.createPod(NS, 'worker-a', APP, { 'controller.kubernetes.io/pod-deletion-cost': '5' });
    const w = await podWorker(kubeconfig, discovery, 'worker-a');
    started.push(w);
    await kube.waitForPod(NS, 'worker-a', stateIs('serving'), 'state serving');

    kube.annotate(NS, 'worker-a', { 'ebb.dev/drain': 'true', 'ebb.dev/drain-reason': 'node maintenance' });
    const drained = await kube.waitForPod(NS, 'worker-a', (p) => stateIs('drained')(p) && annotations(p)['controller.kubernetes.io/pod-deletion-cost'] === LOW, 'drained with a low deletion cost');
    assert.equal(annotations(drained)['ebb.dev/previous-deletion-cost'], '5');
    assert.ok(!Number.isNaN(Date.parse(String(annotations(drained)['ebb.dev/state-since']))));
    const s = await status(w.systemUrl);
    assert.equal(s.state, 'drained');
    assert.equal(s.discovery_registered, false);
    assert.match(s.drain_reason, /annotation ebb\.dev\/drain on pod ebb\/worker-a: node maintenance/);
    // Every state write carried the resourceVersion it was computed from (a precondition).
    const patches = kube.requests.filter((r) => r.method === 'PATCH');
    assert.ok(patches.length > 0 && patches.every((r) => typeof (r.body as { metadata: { resourceVersion?: unknown } }).metadata.resourceVersion === 'string'));

    kube.annotate(NS, 'worker-a', { 'ebb.dev/drain': null, 'ebb.dev/drain-reason': null });
    const back = await kube.waitForPod(NS, 'worker-a', stateIs('serving'), 'serving again');
    assert.equal(annotations(back)['controller.kubernetes.io/pod-deletion-cost'], '5');
    assert.equal(annotations(back)['ebb.dev/previous-deletion-cost'], undefined);
    const s2 = await status(w.systemUrl);
    assert.equal(s2.state, 'serving');
    assert.equal(s2.discovery_registered, true);
    assert.deepEqual(stateWrites(kube, 'worker-a'), ['serving', 'draining', 'drained', 'serving']);
    // The audit trail names the annotation as who asked.
    const trail = (await call('GET', `${w.systemUrl}/engine/events`)).body.events as Array<{ what: string; actor: string }>;
    assert.match(trail.find((e) => e.what === 'drain')?.actor ?? '', /^annotation ebb\.dev\/drain on pod ebb\/worker-a$/);
    assert.match(trail.find((e) => e.what === 'resume')?.actor ?? '', /^annotation ebb\.dev\/drain removed from pod ebb\/worker-a$/);
  });

  it('a worker restarted under the annotation comes up drained, not registered, and keeps the saved cost', async () => {
    const { kube, kubeconfig, discovery } = await setup();
    kube.createPod(NS, 'worker-b', APP);
    const first = await podWorker(kubeconfig, discovery, 'worker-b');
    started.push(first);
    kube.annotate(NS, 'worker-b', { 'ebb.dev/drain': 'true' });
    await kube.waitForPod(NS, 'worker-b', stateIs('drained'), 'drained');
    await first.terminate();

    const second = await podWorker(kubeconfig, discovery, 'worker-b');
    started.push(second);
    await second.waitForEvent('start_drained');
    assert.equal(second.indexOfEvent('discovery_registered'), -1, 'never registered');
    const s = await status(second.systemUrl);
    assert.equal(s.state, 'drained');
    assert.equal(s.discovery_registered, false);
    const pod = kube.pod(NS, 'worker-b');
    assert.equal(annotations(pod)['controller.kubernetes.io/pod-deletion-cost'], LOW);
    assert.equal(annotations(pod)['ebb.dev/previous-deletion-cost'], '', 'the pod had no cost of its own: the saved one stays "none", not the low one');

    kube.annotate(NS, 'worker-b', { 'ebb.dev/drain': null });
    const back = await kube.waitForPod(NS, 'worker-b', stateIs('serving'), 'serving after the annotation is removed');
    assert.equal(annotations(back)['controller.kubernetes.io/pod-deletion-cost'], undefined);
    await second.waitForEvent('resumed');
    assert.equal((await status(second.systemUrl)).discovery_registered, true);
  });

  it('a watch dropped, expired (410) and an API outage mid-drain flip nothing; the drain completes when the work does', async () => {
    const { kube, w, fe } = await podBehindFrontend();
    const stream = await heldStream(fe.url);

    kube.annotate(NS, 'worker-c', { 'ebb.dev/drain': 'true' });
    await kube.waitForPod(NS, 'worker-c', stateIs('draining'), 'draining');

    // An outage: the watch is cut and re-connecting fails until the server is back.
    let mark = w.mark();
    kube.setAvailable(false);
    await w.waitForEvent('k8s_api_error', () => true, { after: mark });
    kube.setAvailable(true);
    // A change the pod's watch does not see, then compaction: the worker's resourceVersion is now
    // too old, so the dropped watch comes back 410 Gone and the worker re-lists.
    kube.createPod(NS, 'unrelated', { app: 'other' });
    kube.compact();
    mark = w.mark();
    kube.dropWatches();
    await w.waitForEvent('k8s_watch_expired', () => true, { after: mark });
    await w.waitForEvent('k8s_relisted', () => true, { after: mark });
    kube.bookmark();

    const s = await status(w.systemUrl);
    assert.equal(s.state, 'draining', 'still draining: the request is in flight');
    assert.equal(s.inflight_requests, 1);
    assert.equal(w.indexOfEvent('resumed'), -1);

    await stream.close();
    await kube.waitForPod(NS, 'worker-c', stateIs('drained'), 'drained once the stream ended');
    assert.deepEqual(stateWrites(kube, 'worker-c'), ['serving', 'draining', 'drained'], 'no state written that the worker did not have');
    assert.equal(w.indexOfEvent('resumed'), -1);
    // Back to serving for the prestop test, which shares this pod.
    const beforeResume = fe.mark();
    kube.annotate(NS, 'worker-c', { 'ebb.dev/drain': null });
    await kube.waitForPod(NS, 'worker-c', stateIs('serving'), 'serving again');
    await sees(fe, 'worker-c', { after: beforeResume });
  });

  it('`ebb prestop` drains through the local Admin API and returns only once drained', async () => {
    const { kube, w, fe } = await podBehindFrontend();
    const stream = await heldStream(fe.url);

    const mark = w.mark();
    const prestop = dieWithFile(spawn(process.execPath, [CLI, 'prestop', '--system-url', w.systemUrl], { env: { ...process.env, ...NO_TOKEN }, stdio: ['ignore', 'pipe', 'pipe'] }));
    let stdout = '';
    prestop.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    // The worker's state when prestop exits: the moment it returns is what it claims.
    const exited = once(prestop, 'exit').then(async ([code]) => ({ code: code as number, state: (await status(w.systemUrl)).state as string }));
    await w.waitForEvent('admission_closed', () => true, { after: mark });
    assert.equal(prestop.exitCode, null, 'prestop still waits while a request is in flight');
    await stream.close();
    const result = await bounded(exited, 'prestop exit');
    assert.equal(result.code, 0);
    assert.equal(result.state, 'drained');
    assert.match(stdout, /worker worker-c drained/);
    assert.match((await status(w.systemUrl)).drain_reason, /preStop hook/);
    await kube.waitForPod(NS, 'worker-c', stateIs('drained'), 'the pod reports drained');
  });
});

describe('pod patcher', () => {
  it('retries a read-modify-write that raced another writer (409 Conflict) on the fresh pod', async () => {
    const { kube, kubeconfig } = await setup();
    kube.createPod(NS, 'p', APP);
    const api = createPodApi(loadKubeConfig(kubeconfig));
    const seen: Array<string | undefined> = [];
    const pod = await updateAnnotations(
      api,
      { namespace: NS, name: 'p' },
      (current) => {
        seen.push(current['other']);
        // The first time, another client writes between our read and our patch.
        if (seen.length === 1) kube.annotate(NS, 'p', { other: 'theirs' });
        return { mine: `saw ${current['other'] ?? 'nothing'}` };
      },
      pino({ level: 'silent' }),
    );
    assert.deepEqual(seen, [undefined, 'theirs']);
    assert.equal(pod.metadata?.annotations?.mine, 'saw theirs');
    assert.equal(pod.metadata?.annotations?.other, 'theirs');
    assert.ok(kube.requests.some((r) => r.method === 'PATCH' && r.contentType === 'application/merge-patch+json'));
  });
});
