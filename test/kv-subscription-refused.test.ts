import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { fakeWorker, injectRecord, type FakeWorker } from './helpers/http.js';
import { bounded, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle } from './helpers/processes.js';
import { openEventStream } from './helpers/event-stream.js';

/**
 * A worker's system port that answers the frontend's event streams with anything but 200 (a
 * subscriber cap, a listener at its connection budget, a stale record's 404). undici emitted an
 * error for each unread body nobody listened to, and the frontend exited 1 (with --processes,
 * its children crash-looped). Real frontend processes, a real worker, and a record in file
 * discovery whose system URL answers 503 and 404.
 */
const started: EbbProcess[] = [];
let refusing: FakeWorker;
let discoveryUrl: string;
/** Resolves once the refusing worker was asked for its status stream (and so refused it). */
let statusStreamAsked: Promise<void>;

before(async () => {
  let n = 0;
  let asked = () => undefined as void;
  statusStreamAsked = new Promise((resolve) => (asked = resolve));
  // Every path refused, alternately as a worker at its cap and as a stale URL would.
  refusing = await fakeWorker((req, res) => {
    if (req.url === '/engine/status/events') asked();
    const busy = n++ % 2 === 0;
    res.writeHead(busy ? 503 : 404, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: { code: busy ? 'listener_busy' : 'not_found', message: 'refused by the test' } }));
  });
  discoveryUrl = tempDiscoveryUrl();
  injectRecord(discoveryUrl, {
    worker_id: 'w-refusing',
    model: 'ghost',
    request_url: 'http://127.0.0.1:1',
    system_url: refusing.url,
    kv_cache: { block_size: 16, tokenizer: 'mocker-words', events: 'exact' },
  });
  started.push(await startWorker(['--discovery', discoveryUrl, '--model', 'm1', '--mocker-ttft-ms', '0', '--mocker-itl-ms', '1']));
});

after(async () => {
  await Promise.all(started.map((p) => p.stop()));
  await refusing.close();
});

/** Waits until the frontend has been refused `times` times on the worker's KV event stream, then proves it still serves. */
async function survives(frontend: FrontendHandle, times: number): Promise<void> {
  let after = 0;
  for (let i = 0; i < times; i++) {
    const refused = await frontend.waitForEvent('kv_stream_failed', (l) => l.worker_id === 'w-refusing' && /HTTP (503|404)/.test(String(l.reason)), { after });
    after = frontend.logs.indexOf(refused) + 1;
  }
  const client = new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'unused', maxRetries: 0 });
  const answer = await client.chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 });
  assert.equal(answer.choices[0]?.finish_reason, 'length');
  assert.equal(frontend.proc.exitCode, null, 'the frontend exited');
}

describe('a worker refusing the frontend its event streams', () => {
  it('leaves a single-process frontend up and routing (KV events, and the dashboard status stream)', async () => {
    const frontend = await startFrontend(discoveryUrl, ['--router', 'kv', '--admin-port', '0'], { EBB_LOG_LEVEL: 'debug' });
    started.push(frontend);
    const adminUrl = (await frontend.waitForEvent('admin_ready')).url as string;
    // A dashboard following the fleet makes the frontend subscribe to every worker's status stream too.
    await survives(frontend, 3);
    const dashboard = await openEventStream(`${adminUrl}/workers/events`);
    try {
      await bounded(statusStreamAsked, "the frontend asking the refusing worker for /engine/status/events");
      await dashboard.waitFor((e) => e.event === 'worker_unreachable' && e.data.worker_id === 'w-refusing', 'the dashboard told the refusing worker is unreachable');
      assert.equal(frontend.proc.exitCode, null, 'the frontend exited after its status stream was refused');
    } finally {
      dashboard.close();
    }
  });

  it('leaves every process of a --processes 2 frontend up: no child exits', async () => {
    const frontend = await startFrontend(discoveryUrl, ['--router', 'kv', '--processes', '2'], { EBB_LOG_LEVEL: 'debug' });
    started.push(frontend);
    await survives(frontend, 4);
    assert.equal(frontend.logs.find((l) => l.event === 'frontend_process_exited'), undefined, 'a frontend process exited');
  });
});

