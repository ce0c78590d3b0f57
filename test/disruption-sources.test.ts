import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { call } from './helpers/http.js';
import { FakeAzureMetadata, FakeGceMetadata, FakeImds } from './helpers/cloud-metadata.js';
import { NS, podWorker, startKube } from './helpers/k8s-fixture.js';
import { bounded, frontendSeesWorkers, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type LogLine, type WorkerHandle } from './helpers/processes.js';
import { streamCompletion, type StreamOutcome } from './helpers/sse.js';

const started: EbbProcess[] = [];
const closers: Array<() => Promise<void>> = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
  await Promise.all(closers.map((c) => c()));
});

async function imds(): Promise<FakeImds> {
  const f = new FakeImds();
  await f.start();
  closers.push(() => f.close());
  return f;
}

const status = async (w: WorkerHandle) => (await call('GET', `${w.systemUrl}/engine/status`)).body;
const events = async (w: WorkerHandle) => (await call('GET', `${w.systemUrl}/engine/events`)).body.events as Array<{ what: string; actor: string; result: string; reason: string | null }>;
const timeOf = (l: LogLine): number => Date.parse(l.time as string);

// 20 streams of 200 tokens at 50 ms: 10 s each, still running when a notice 10 s ahead, less a
// 4 s margin, hands them off.
const STREAMS = 20;
const TOKENS = 200;
const NOTICE_MS = 10_000;
const MARGIN_MS = 4000;
const ITL = ['--mocker-itl-ms', '50', '--mocker-batch-slots', '32'];

/** The texts of the same requests undisturbed: the mocker's text depends only on prompt and seed. */
let expected: Promise<string[]>;
before(() => {
  expected = (async () => {
    const discovery = tempDiscoveryUrl();
    const w = await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '0', '--mocker-ttft-ms', '0']);
    started.push(w);
    const fe = await startFrontend(discovery);
    started.push(fe);
    await frontendSeesWorkers(fe, 1);
    const out: string[] = [];
    for (let seed = 0; seed < STREAMS; seed++) {
      const r = await streamCompletion(fe.url, { model: 'm1', max_tokens: TOKENS, seed });
      assert.equal(r.tokens, TOKENS, r.error);
      out.push(r.text);
    }
    await Promise.all([w.stop(), fe.stop()]);
    return out;
  })();
});

/**
 * The case every source must pass: `target` (started, with its source, as the only worker in
 * discovery) takes 20 streams; two more workers, started drained beforehand, resume; `announce`
 * makes the platform's notice for the time it returns (the interruption).
 * The target drains with a deadline before then, hands its streams off, and is drained before it;
 * every stream completes with its undisturbed text.
 */
async function noticeUnderLoad(discovery: string, target: WorkerHandle, source: string, marginMs: number, announce: () => number): Promise<void> {
  const texts = await expected;
  // The other two are out of discovery (drained) until the streams run on the target.
  const others = await Promise.all([0, 1].map(() => startWorker(['--discovery', discovery, '--model', 'm1', ...ITL])));
  started.push(...others);
  for (const w of others) assert.equal((await call('POST', `${w.systemUrl}/engine/drain`, { reason: 'held out until the streams run' })).status, 200);
  const frontend = await startFrontend(discovery);
  started.push(frontend);
  await frontendSeesWorkers(frontend, 1);
  let progressed = 0;
  let allProgressed!: () => void;
  const progress = new Promise<void>((resolve) => (allProgressed = resolve));
  const streams: Array<Promise<StreamOutcome>> = Array.from({ length: STREAMS }, (_, seed) =>
    streamCompletion(frontend.url, { model: 'm1', max_tokens: TOKENS, seed, stream_options: { include_usage: true } }, undefined, (n) => {
      if (n === 3 && ++progressed === STREAMS) allProgressed();
    }),
  );
  await bounded(progress, `all ${STREAMS} streams to start on ${target.workerId}`);
  assert.equal((await status(target)).inflight_requests, STREAMS);
  for (const w of others) assert.equal((await call('POST', `${w.systemUrl}/engine/resume`, {})).status, 200);
  await frontendSeesWorkers(frontend, 3);

  const mark = target.mark();
  const interruptionAt = announce();
  const draining = await target.waitForEvent('state_changed', (l) => l.to === 'draining', { after: mark });
  const s = await status(target);
  assert.match(s.drain_reason, new RegExp(`^${source} disruption notice`), 'the drain reason names the source');
  assert.ok(Math.abs(Date.parse(s.drain_deadline) - (interruptionAt - marginMs)) < 1000, `deadline ${s.drain_deadline} is the notice's time less the margin`);
  const drained = await target.waitForEvent('state_changed', (l) => l.to === 'drained', { after: mark, boundMs: NOTICE_MS + 20_000 });
  assert.ok(timeOf(drained) < interruptionAt, `drained at ${drained.time as string}, before the interruption at ${new Date(interruptionAt).toISOString()}`);
  assert.ok(timeOf(draining) < timeOf(drained));
  const final = await status(target);
  assert.equal(final.state, 'drained');
  assert.equal(final.handed_off, STREAMS, 'every stream still running at the deadline was handed off');
  const results = await Promise.all(streams);
  for (const [i, r] of results.entries()) {
    assert.equal(r.status, 200, `stream ${i}: ${r.error}`);
    assert.equal(r.error, undefined, `stream ${i} had an error event`);
    assert.equal(r.text, texts[i], `stream ${i}: text equals the undisturbed run`);
    assert.equal(r.usage?.completion_tokens, TOKENS, `stream ${i}: usage counts the whole completion`);
  }
  const drainEvent = (await events(target)).find((e) => e.what === 'drain');
  assert.equal(drainEvent?.actor, `disruption source ${source}`);
}

describe('disruption notices drain ahead of the machine going', () => {
  it('aws: a spot interruption 10 s ahead, on the worker with 20 streams: drained before it, 20/20 streams identical', async () => {
    const f = await imds();
    const discovery = tempDiscoveryUrl();
    const target = await startWorker(['--discovery', discovery, '--model', 'm1', ...ITL, '--disruption-source', 'aws', '--disruption-margin-ms', String(MARGIN_MS), '--disruption-poll-ms', '200'], { AWS_EC2_METADATA_SERVICE_ENDPOINT: f.url });
    started.push(target);
    await noticeUnderLoad(discovery, target, 'aws', MARGIN_MS, () => {
      const at = Math.floor((Date.now() + NOTICE_MS) / 1000) * 1000; // IMDS times are to the second
      f.announceSpotInterruption(at);
      return at;
    });
    assert.ok(f.tokenRequests >= 1 && f.tokenRequests <= 2, `IMDSv2: one session token reused (${f.tokenRequests} asked)`);
  });

  it('gcp: instance/preempted TRUE (30 s ahead), long-polled: drained before it, 20/20 streams identical', async () => {
    const f = new FakeGceMetadata();
    await f.start();
    closers.push(() => f.close());
    const discovery = tempDiscoveryUrl();
    // 30 s of notice less a 24 s margin: the hand-off 6 s after it.
    const margin = 30_000 - (NOTICE_MS - MARGIN_MS);
    const target = await startWorker(['--discovery', discovery, '--model', 'm1', ...ITL, '--disruption-source', 'gcp', '--disruption-margin-ms', String(margin)], { GCE_METADATA_HOST: f.host });
    started.push(target);
    await bounded(
      (async () => {
        while (f.waiting('preempted') === 0) await new Promise((r) => setTimeout(r, 50));
      })(),
      'the worker to long-poll instance/preempted',
    );
    await noticeUnderLoad(discovery, target, 'gcp', margin, () => {
      const seen = Date.now();
      f.set('preempted', 'TRUE');
      return seen + 30_000;
    });
    assert.ok(f.requests.some((r) => r.path.includes('wait_for_change=true')), 'long-polled, not polled');
  });

  it('k8s: the pod condition DisruptionTarget: drained before its grace period ends, 20/20 streams identical', async () => {
    const { kube, kubeconfig } = await startKube();
    closers.push(() => kube.close());
    kube.createNode('node-1');
    kube.createPod(NS, 'w1', { app: 'ebb-worker' });
    kube.patchPod(NS, 'w1', { spec: { terminationGracePeriodSeconds: NOTICE_MS / 1000 } });
    const discovery = tempDiscoveryUrl();
    const target = await podWorker(kubeconfig, discovery, 'w1', [...ITL, '--disruption-source', 'k8s', '--disruption-margin-ms', String(MARGIN_MS)]);
    started.push(target);
    await noticeUnderLoad(discovery, target, 'k8s', MARGIN_MS, () => {
      const since = Math.floor(Date.now() / 1000) * 1000; // conditions are dated to the second
      kube.patchPod(NS, 'w1', { status: { conditions: [{ type: 'DisruptionTarget', status: 'True', reason: 'EvictionByEvictionAPI', message: 'Eviction API: evicting', lastTransitionTime: new Date(since).toISOString().replace(/\.\d{3}Z$/, 'Z') }] } });
      return since + NOTICE_MS;
    });
  });
});

describe('withdrawn notices', () => {
  const idle = (extra: string[], env: NodeJS.ProcessEnv) => startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'm1', '--disruption-margin-ms', '10000', '--disruption-lead-ms', '60000', '--disruption-poll-ms', '100', ...extra], env);

  it('aws: a scheduled maintenance drains at once when within the lead; cancelled, the worker resumes', async () => {
    const f = await imds();
    const w = await idle(['--disruption-source', 'aws'], { AWS_EC2_METADATA_SERVICE_ENDPOINT: f.url });
    started.push(w);
    const mark = w.mark();
    f.scheduleMaintenance('instance-event-0d59937288b749b32', 'system-reboot', Date.now() + 60_000);
    await w.waitForEvent('state_changed', (l) => l.to === 'drained', { after: mark });
    assert.match((await status(w)).drain_reason, /^aws disruption notice: scheduled maintenance system-reboot/);
    f.cancelMaintenance('instance-event-0d59937288b749b32');
    await w.waitForEvent('state_changed', (l) => l.to === 'serving' && l.trigger === 'resume', { after: mark });
    const s = await status(w);
    assert.equal(s.state, 'serving');
    assert.equal(s.discovery, 'registered');
    const resume = (await events(w)).find((e) => e.what === 'resume');
    assert.equal(resume?.actor, 'disruption source aws (notice withdrawn)');
  });

  it("aws: an operator's drain is not the notice's to undo: it takes the notice's deadline and stays drained once the notice is cancelled", async () => {
    const f = await imds();
    const w = await idle(['--disruption-source', 'aws'], { AWS_EC2_METADATA_SERVICE_ENDPOINT: f.url });
    started.push(w);
    assert.equal((await call('POST', `${w.systemUrl}/engine/drain`, { reason: 'operator' })).status, 200);
    const mark = w.mark();
    const at = Math.floor((Date.now() + 60_000) / 1000) * 1000;
    f.scheduleMaintenance('instance-event-1', 'instance-stop', at);
    await w.waitForEvent('disruption_notice', undefined, { after: mark });
    await bounded(
      (async () => {
        while ((await status(w)).drain_deadline === null) await new Promise((r) => setTimeout(r, 50));
      })(),
      "the notice's deadline on the operator's drain",
    );
    assert.ok(Math.abs(Date.parse((await status(w)).drain_deadline) - (at - 10_000)) < 1000, "the notice's time less the margin");
    f.cancelMaintenance('instance-event-1');
    const withdrawn = await w.waitForEvent('disruption_withdrawn', undefined, { after: mark });
    assert.equal(withdrawn.resumes, false);
    const s = await status(w);
    assert.equal(s.state, 'drained');
    assert.equal(s.drain_reason, 'operator');
  });

  it('gcp: maintenance-event TERMINATE_ON_HOST_MAINTENANCE drains, back to NONE resumes; MIGRATE_ON_HOST_MAINTENANCE is a hint only', async () => {
    const f = new FakeGceMetadata();
    await f.start();
    closers.push(() => f.close());
    const w = await idle(['--disruption-source', 'gcp'], { GCE_METADATA_HOST: f.host });
    started.push(w);
    const mark = w.mark();
    f.set('maintenance-event', 'MIGRATE_ON_HOST_MAINTENANCE');
    await w.waitForEvent('disruption_hint', (l) => l.maintenance_event === 'MIGRATE_ON_HOST_MAINTENANCE', { after: mark });
    assert.equal((await status(w)).state, 'serving', 'a live migration keeps the VM');
    f.set('maintenance-event', 'TERMINATE_ON_HOST_MAINTENANCE');
    await w.waitForEvent('state_changed', (l) => l.to === 'drained', { after: mark });
    assert.match((await status(w)).drain_reason, /^gcp disruption notice: instance\/maintenance-event TERMINATE_ON_HOST_MAINTENANCE/);
    f.set('maintenance-event', 'NONE');
    await w.waitForEvent('state_changed', (l) => l.to === 'serving' && l.trigger === 'resume', { after: mark });
  });

  it("azure: only this VM's Preempt drains (another VM's and a Freeze do not); cancelled, it resumes", async () => {
    const f = new FakeAzureMetadata('vm-ebb-1');
    await f.start();
    closers.push(() => f.close());
    const w = await idle(['--disruption-source', 'azure'], { EBB_AZURE_METADATA_ENDPOINT: f.url });
    started.push(w);
    const mark = w.mark();
    f.schedule('other-vm', 'Preempt', Date.now() + 30_000, ['vm-other']);
    f.schedule('freeze', 'Freeze', Date.now() + 30_000);
    // Read after both were scheduled: a poll that saw them and drained nothing.
    const reads = () => f.requests.filter((r) => r.path.startsWith('/metadata/scheduledevents')).length;
    const seen = reads();
    await bounded(
      (async () => {
        while (reads() < seen + 2) await new Promise((r) => setTimeout(r, 50));
      })(),
      'two polls of the scheduled events',
    );
    assert.equal((await status(w)).state, 'serving');
    f.schedule('mine', 'Preempt', Date.now() + 30_000);
    await w.waitForEvent('state_changed', (l) => l.to === 'drained', { after: mark });
    assert.match((await status(w)).drain_reason, /^azure disruption notice: scheduled event Preempt/);
    f.cancel('mine');
    await w.waitForEvent('state_changed', (l) => l.to === 'serving' && l.trigger === 'resume', { after: mark });
  });

  it("k8s: the node's ToBeDeletedByClusterAutoscaler taint drains, its removal resumes; a cordon alone is a hint", async () => {
    const { kube, kubeconfig } = await startKube();
    closers.push(() => kube.close());
    kube.createNode('node-1');
    kube.createPod(NS, 'w2', { app: 'ebb-worker' });
    const w = await podWorker(kubeconfig, tempDiscoveryUrl(), 'w2', ['--disruption-source', 'k8s', '--disruption-margin-ms', '10000']);
    started.push(w);
    const mark = w.mark();
    kube.patchNode('node-1', { spec: { unschedulable: true, taints: [{ key: 'node.kubernetes.io/unschedulable', effect: 'NoSchedule', timeAdded: new Date().toISOString() }] } });
    await w.waitForEvent('disruption_hint', (l) => l.node === 'node-1', { after: mark });
    assert.equal((await status(w)).state, 'serving', 'a cordon is not a removal');
    kube.patchNode('node-1', {
      spec: {
        taints: [
          { key: 'node.kubernetes.io/unschedulable', effect: 'NoSchedule' },
          { key: 'ToBeDeletedByClusterAutoscaler', value: String(Math.floor(Date.now() / 1000)), effect: 'NoSchedule' },
        ],
      },
    });
    await w.waitForEvent('state_changed', (l) => l.to === 'drained', { after: mark });
    assert.match((await status(w)).drain_reason, /^k8s disruption notice: node node-1 taint ToBeDeletedByClusterAutoscaler/);
    kube.patchNode('node-1', { spec: { unschedulable: null, taints: null } });
    await w.waitForEvent('state_changed', (l) => l.to === 'serving' && l.trigger === 'resume', { after: mark });
  });
});
