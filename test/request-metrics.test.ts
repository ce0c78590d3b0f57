/**
 * The request metrics an SRE charts (issue 46): requests by model, tier, tenant (bounded as the
 * queue's) and outcome; end-to-end latency, time to first token (streamed and not), inter-token
 * latency and tokens, by model and tier. A real frontend and worker; promtool checks the page.
 */
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { call } from './helpers/http.js';
import { bounded, startFleet, type EbbProcess, type FrontendHandle } from './helpers/processes.js';
import { skipWithout } from './helpers/required-tool.js';
import { streamCompletion } from './helpers/sse.js';

/** Every sample of `name` on a page: its labels and value. */
function samples(page: string, name: string): Array<{ labels: Record<string, string>; value: number }> {
  const out: Array<{ labels: Record<string, string>; value: number }> = [];
  for (const line of page.split('\n')) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    const labels = Object.fromEntries([...line.matchAll(/(\w+)="([^"]*)"/g)].map((m) => [m[1]!, m[2]!]));
    out.push({ labels, value: Number(line.slice(line.lastIndexOf(' ') + 1)) });
  }
  return out;
}

const sum = (xs: Array<{ value: number }>) => xs.reduce((n, x) => n + x.value, 0);

describe('request metrics by model, tier, tenant and outcome', () => {
  const started: EbbProcess[] = [];
  let frontend: FrontendHandle;
  before(async () => {
    // Two batch slots: with both held, a flex request waits in the frontend's queue (the worker admits flex only to a free slot), and past 500 ms is shed (429).
    const fleet = await startFleet(1, ['--mocker-batch-slots', '2', '--mocker-itl-ms', '10', '--mocker-ttft-ms', '0'], ['--queue-timeout', '500']);
    frontend = fleet.frontend;
    started.push(frontend, ...fleet.workers);
  });
  after(async () => {
    await Promise.all(started.map((p) => p.stop()));
  });

  it('counts each request once by model, tier, tenant (20 named, the rest other) and outcome (ok, shed, invalid, client_gone); TTFT of streamed and collected answers; inter-token latency and tokens; no series for an unknown model; promtool clean', async () => {
    // 22 tenants, one collected answer each: the first 20 named, the last 2 counted as other.
    for (let i = 0; i < 22; i++) {
      const r = await call('POST', `${frontend.url}/v1/chat/completions`, { model: 'm1', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 }, { 'x-ebb-tenant': `tenant-${i}` });
      assert.equal(r.status, 200, JSON.stringify(r.body));
    }
    // Two priority streams hold both slots; a flex request waits for one past the queue timeout: shed.
    let streaming = 0;
    let bothStreaming!: () => void;
    const both = new Promise<void>((resolve) => (bothStreaming = resolve));
    const longs = [0, 1].map(() => streamCompletion(frontend.url, { model: 'm1', max_tokens: 150 }, () => ++streaming === 2 && bothStreaming(), undefined, { 'x-ebb-service-tier': 'priority', 'x-ebb-tenant': 'tenant-0' }));
    await bounded(both, "both priority streams' first tokens");
    const shed = await call('POST', `${frontend.url}/v1/chat/completions`, { model: 'm1', messages: [{ role: 'user', content: 'wait' }], max_tokens: 3 }, { 'x-ebb-service-tier': 'flex', 'x-ebb-tenant': 'tenant-2' });
    assert.equal(shed.status, 429, JSON.stringify(shed.body));
    for (const whole of await Promise.all(longs)) assert.equal(whole.tokens, 150, whole.error);
    // A client that leaves mid-stream, a request the schema refuses, a model nobody serves.
    const cut = new AbortController();
    const res = await fetch(`${frontend.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-ebb-tenant': 'tenant-1' },
      body: JSON.stringify({ model: 'm1', messages: [{ role: 'user', content: 'hi' }], max_tokens: 500, stream: true }),
      signal: cut.signal,
    });
    const reader = (res.body as ReadableStream<Uint8Array>).getReader();
    await reader.read();
    cut.abort();
    assert.equal((await call('POST', `${frontend.url}/v1/chat/completions`, { model: 'm1', messages: [{ role: 'user', content: 'hi' }], max_tokens: -1 })).status, 400);
    assert.equal((await call('POST', `${frontend.url}/v1/chat/completions`, { model: 'no-such-model', messages: [{ role: 'user', content: 'hi' }] })).status, 404);

    // The gone client's request is counted as its response closes, before the relay logs it gone.
    await frontend.waitForEvent('client_gone');
    const page = await fetch(`${frontend.url}/metrics`).then((r) => r.text());
    const requests = samples(page, 'ebb_frontend_model_requests_total');
    const of = (labels: Record<string, string>) => sum(requests.filter((s) => Object.entries(labels).every(([k, v]) => s.labels[k] === v)));
    assert.equal(of({ model: 'm1', tier: 'default', outcome: 'ok' }), 22, 'the collected answers');
    assert.equal(of({ model: 'm1', tier: 'priority', tenant: 'tenant-0', outcome: 'ok' }), 2, 'the priority streams');
    assert.equal(of({ model: 'm1', tier: 'flex', outcome: 'shed' }), 1, 'the flex request the queue shed (429)');
    assert.equal(of({ model: 'm1', outcome: 'invalid' }), 1, 'the 400');
    assert.equal(of({ model: 'm1', tenant: 'tenant-1', outcome: 'client_gone' }), 1, 'the stream whose client left');
    const tenants = new Set(requests.map((s) => s.labels.tenant));
    assert.equal(tenants.size, 21, `20 named tenants and other: ${[...tenants].join(', ')}`);
    assert.ok(tenants.has('other') && !tenants.has('tenant-20') && !tenants.has('tenant-21'));
    assert.ok(!page.includes('model="no-such-model"'), 'no series for a model nobody serves');
    assert.match(page, /^ebb_frontend_requests_total\{endpoint="\/v1\/chat\/completions",status="404"\} 1$/m, 'still counted by endpoint and status');

    const ttft = samples(page, 'gen_ai_server_time_to_first_token_seconds_count');
    assert.equal(sum(ttft.filter((s) => s.labels.tier === 'default')), 23, 'the 22 collected answers and the stream whose client left');
    assert.equal(sum(ttft.filter((s) => s.labels.tier === 'priority')), 2);
    const duration = samples(page, 'gen_ai_server_request_duration_seconds_count');
    assert.equal(sum(duration.filter((s) => s.labels.outcome === 'shed')), 1);
    assert.equal(sum(duration), sum(requests), 'one duration per request counted');
    const itl = samples(page, 'gen_ai_server_time_per_output_token_seconds_count');
    assert.equal(sum(itl), 24, 'one inter-token latency per answer that ended whole');
    const tokens = samples(page, 'ebb_frontend_tokens_total');
    assert.equal(sum(tokens.filter((s) => s.labels.type === 'output')), 22 * 3 + 2 * 150);
    assert.ok(sum(tokens.filter((s) => s.labels.type === 'input')) > 0);
    assertPromtoolClean(page);
  });

  it('a request asking service_tier scale is counted in the tier it is served in (priority); a GET of stored chat completions is no request counted', async () => {
    const page = () => fetch(`${frontend.url}/metrics`).then((r) => r.text());
    const chat = (text: string) => sum(samples(text, 'ebb_frontend_requests_total').filter((s) => s.labels.endpoint === '/v1/chat/completions'));
    const before = await page();
    const listed = await call('GET', `${frontend.url}/v1/chat/completions`);
    assert.ok(listed.status === 200 || listed.status === 405, JSON.stringify(listed.body));
    const r = await call('POST', `${frontend.url}/v1/chat/completions`, { model: 'm1', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3, service_tier: 'scale' }, { 'x-ebb-tenant': 'tenant-scale' });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(r.body.service_tier, 'priority');
    // Counted as its response closes: read until it is there.
    const after = await bounded(
      (async () => {
        for (;;) {
          const text = await page();
          if (chat(text) > chat(before)) return text;
          await new Promise((resolve) => setImmediate(resolve));
        }
      })(),
      'the scale request to be counted',
    );
    assert.equal(chat(after) - chat(before), 1, 'the POST alone: a list is no generation');
    const scale = samples(after, 'ebb_frontend_model_requests_total').filter((s) => s.labels.tenant === 'other' || s.labels.tenant === 'tenant-scale');
    assert.equal(sum(scale.filter((s) => s.labels.tier === 'priority')) - sum(samples(before, 'ebb_frontend_model_requests_total').filter((s) => (s.labels.tenant === 'other' || s.labels.tenant === 'tenant-scale') && s.labels.tier === 'priority')), 1, 'in the priority tier');
  });
});

const promtool = spawnSync('promtool', ['--version']).status === 0;

function assertPromtoolClean(text: string): void {
  if (skipWithout(promtool, 'promtool not installed: the metrics check SKIPPED; apt-get install prometheus') !== undefined) return;
  const res = spawnSync('promtool', ['check', 'metrics'], { input: text, encoding: 'utf8' });
  assert.equal(res.status, 0, `promtool check metrics: ${res.stdout}${res.stderr}`);
}
