import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { call, fakeWorker, injectRecord, json, type FakeWorker } from './helpers/http.js';
import { bounded, metricValue, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess } from './helpers/processes.js';

const started: EbbProcess[] = [];
const fakes: FakeWorker[] = [];
after(async () => {
  await Promise.all([...started.map((p) => p.stop()), ...fakes.map((f) => f.close())]);
});

describe('frontend: a prefill worker that never answers', () => {
  it('times the prefill out (--prefill-timeout-ms), counts it against that worker and prefills on another', async () => {
    const discovery = tempDiscoveryUrl();
    // Accepts /prefill and never answers, as a wedged engine would; everything else is fine.
    const hung = await fakeWorker((req, res) => {
      if (req.url !== '/prefill') json(res, 200, { status: 'ok' });
    });
    fakes.push(hung);
    injectRecord(discovery, { worker_id: 'w-hung-prefill', model: 'm1', mode: 'prefill', request_url: hung.url, system_url: hung.url });
    for (const mode of ['prefill', 'decode']) started.push(await startWorker(['--discovery', discovery, '--model', 'm1', '--mode', mode, '--mocker-itl-ms', '1']));
    // Past any stall of a healthy prefill worker on a loaded machine, so only the hung one times out.
    const frontend = await startFrontend(discovery, ['--prefill-timeout-ms', '2000']);
    started.push(frontend);

    // Least in-flight routing spreads concurrent prefills over both prefill workers: some land on the hung one.
    const answers = await bounded(
      Promise.all([0, 1, 2, 3].map((i) => call('POST', `${frontend.url}/v1/completions`, { model: 'm1', prompt: `prompt ${i}`, max_tokens: 3 }))),
      'every request answered',
    );
    for (const a of answers) {
      assert.equal(a.status, 200, JSON.stringify(a.body));
      assert.equal(a.body.usage.completion_tokens, 3);
    }
    assert.ok(hung.seen.some((r) => r.url === '/prefill'), 'the hung prefill worker was tried');
    assert.ok((await metricValue(frontend.url, 'ebb_frontend_upstream_attempts_total', 'worker_id="w-hung-prefill",outcome="prefill_timeout"')) >= 1, 'counted as its failure');
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_worker_inflight_requests', 'worker_id="w-hung-prefill"'), 0, 'its slot accounting was freed');
  });
});
