import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { estimateDrainMs, TokenPace } from '../src/worker/drain-eta.js';
import { call, openLineStream } from './helpers/http.js';
import { openEventStream } from './helpers/event-stream.js';
import { spawnEbb, startWorker, tempDiscoveryUrl, type EbbProcess } from './helpers/processes.js';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

/** One short request first: the ETA needs an observed per-token time. */
async function warmUp(requestUrl: string): Promise<void> {
  await (await openLineStream(`${requestUrl}/generate`, { model: 'm1', prompt: 'warm', max_tokens: 5, stream: true })).done;
}

function pace(perToken: number, firstToken?: number): TokenPace {
  const p = new TokenPace();
  p.tokenGap(perToken);
  if (firstToken !== undefined) p.firstTokenAfter(firstToken);
  return p;
}

describe('drain ETA: the estimate', () => {
  it('is the longest remaining budget times the per-token time while every request has a slot', () => {
    const eta = estimateDrainMs([{ budget: 100, generated: 40 }, { budget: 30, generated: 10 }], pace(10), 8);
    assert.equal(eta, 600);
  });

  it('adds the time to first token for requests not started, and queues past the batch slots', () => {
    // 1 slot: the running one ends at 50 ms, then the queued one takes 20 (first token) + 100 ms.
    assert.equal(estimateDrainMs([{ budget: 10, generated: 5 }, { budget: 10, generated: 0 }], pace(10, 20), 1), 170);
    // 2 slots: both run at once.
    assert.equal(estimateDrainMs([{ budget: 10, generated: 5 }, { budget: 10, generated: 0 }], pace(10, 20), 2), 120);
  });

  it('is unknown with an unbounded request or before any token was timed; 0 with nothing in flight', () => {
    assert.equal(estimateDrainMs([{ budget: undefined, generated: 3 }], pace(10), 4), null);
    assert.equal(estimateDrainMs([{ budget: 10, generated: 0 }], new TokenPace(), 4), null);
    assert.equal(estimateDrainMs([], new TokenPace(), 4), 0);
  });
});

describe('drain ETA: a draining worker', () => {
  it('reports eta_ms in /engine/status while requests run, and drain --wait shows it', async () => {
    const w = await startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'm1', '--mocker-itl-ms', '20']);
    started.push(w);
    await warmUp(w.requestUrl);
    const streams = await Promise.all([200, 100].map((max_tokens) => openLineStream(`${w.requestUrl}/generate`, { model: 'm1', prompt: 'p', max_tokens, stream: true })));
    await Promise.all(streams.map((s) => s.first));
    const serving = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(serving.body.eta_ms, null, 'no ETA while serving');

    // ebb drain --wait follows the drain and prints its ETA on the progress line.
    const cli = spawnEbb(['drain', w.systemUrl, '--wait', '--timeout', '30s'], 'ebb drain');
    started.push(cli);
    assert.equal(await cli.exitCode(), 0, cli.stderr.join('\n'));
    assert.match(cli.stderr.join('\n'), /draining, in-flight \d+.*, eta \d+(\.\d)?s/, 'the progress line carries the ETA');
    await Promise.all(streams.map((s) => s.done));
    const drained = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(drained.body.state, 'drained');
    assert.equal(drained.body.eta_ms, null, 'no ETA once drained');
  });

  it('gives a number while draining with bounded requests, and null once only an engine that cannot tell is left', async () => {
    const w = await startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'm1', '--mocker-itl-ms', '20', '--mocker-idleness', 'unknown']);
    started.push(w);
    await warmUp(w.requestUrl);
    const s = await openLineStream(`${w.requestUrl}/generate`, { model: 'm1', prompt: 'p', max_tokens: 60, stream: true });
    await s.first;
    const drain = await call('POST', `${w.systemUrl}/engine/drain`, { reason: 'eta' });
    assert.equal(drain.body.state, 'draining');
    assert.equal(typeof drain.body.eta_ms, 'number', `eta_ms in ${JSON.stringify(drain.body)}`);
    assert.ok(drain.body.eta_ms > 0);
    const events = await openEventStream(`${w.systemUrl}/engine/status/events`);
    await s.done;
    let unknown: Record<string, any>;
    try {
      const e = await events.waitFor((x) => x.event === 'status' && x.data.inflight_requests === 0 && x.data.waiting_for.some((y: string) => /unknown/.test(y)), 'idleness unknown');
      unknown = e.data;
    } finally {
      events.close();
    }
    assert.equal(unknown.state, 'draining', 'fail-closed: it never drains');
    assert.equal(unknown.eta_ms, null, 'an engine that cannot tell gets no ETA');
  });
});
