import { after, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseTokenFile } from '../src/common/admin-auth.js';
import { call, openLineStream } from './helpers/http.js';
import { openEventStream } from './helpers/event-stream.js';
import { startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess } from './helpers/processes.js';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

const NO_TOKEN = { EBB_ADMIN_TOKEN: undefined };
const bearer = (token: string) => ({ authorization: `Bearer ${token}` });

function tokenFile(text: string): string {
  const path = join(mkdtempSync(join(tmpdir(), 'ebb-test-token-')), 'admin-tokens');
  writeFileSync(path, text, { mode: 0o600 });
  return path;
}

const events = async (systemUrl: string, token?: string) => (await call('GET', `${systemUrl}/engine/events`, undefined, token === undefined ? {} : bearer(token))).body.events as Array<Record<string, any>>;

describe('admin token files', () => {
  it('reads name:token lines as named tokens, anything else as one token named admin', () => {
    assert.deepEqual(parseTokenFile('alice:tok-a\n# ops\nbob:tok-b\n', 'f'), [
      { name: 'alice', token: 'tok-a' },
      { name: 'bob', token: 'tok-b' },
    ]);
    assert.deepEqual(parseTokenFile('just-a-token\n', 'f'), [{ name: 'admin', token: 'just-a-token' }]);
    assert.deepEqual(parseTokenFile('not a named line\nalice:x\n', 'f'), [{ name: 'admin', token: 'not a named line' }]);
    assert.throws(() => parseTokenFile('a:1\na:2\n', 'f'), /names "a" twice/);
    assert.throws(() => parseTokenFile('\n', 'f'), /empty/);
  });
});

describe('audit trail: worker', () => {
  it('records drain, drained and resume with the token name as actor, reason, generation, result and duration', async () => {
    const w = await startWorker(['--discovery', tempDiscoveryUrl(), '--admin-token-file', tokenFile('alice:tok-a\nbob:tok-b\n')], NO_TOKEN);
    started.push(w);
    assert.equal((await call('POST', `${w.systemUrl}/engine/drain`, undefined, bearer('tok-c'))).status, 403);
    const drained = await call('POST', `${w.systemUrl}/engine/drain`, { reason: 'kernel upgrade' }, bearer('tok-b'));
    assert.ok(drained.status === 200 || drained.status === 202);
    const audited = await w.waitForEvent('audit', (l) => l.what === 'drained');
    assert.equal(audited.actor, 'bob');
    const resumed = await call('POST', `${w.systemUrl}/engine/resume`, undefined, bearer('tok-a'));
    assert.equal(resumed.body.state, 'serving');

    const trail = await events(w.systemUrl, 'tok-a');
    assert.deepEqual(trail.map((e) => [e.what, e.actor, e.result, e.generation]), [
      ['drain', 'bob', drained.body.state, 1],
      ['drained', 'bob', 'drained', 1],
      ['resume', 'alice', 'serving', 2],
    ]);
    assert.equal(trail[0]?.reason, 'kernel upgrade');
    assert.equal(trail[1]?.reason, 'kernel upgrade');
    for (const e of trail) {
      assert.equal(typeof e.duration_ms, 'number');
      assert.ok(!Number.isNaN(Date.parse(e.at)), 'at is a timestamp');
    }
    // Each is one JSON log line too (log lines travel a pipe: they may trail the HTTP answer).
    await w.waitForEvent('audit', (l) => l.what === 'resume');
    const logged = w.logs.filter((l) => l.event === 'audit').map((l) => l.what);
    assert.deepEqual(logged, ['drain', 'drained', 'resume']);
  });

  it('on an open loopback listener the actor is the caller address; a hand-off at the drain deadline is audited for the drain', async () => {
    const w = await startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'm1', '--mocker-itl-ms', '20'], NO_TOKEN);
    started.push(w);
    const stream = await openLineStream(`${w.requestUrl}/generate`, { model: 'm1', prompt: 'long one', max_tokens: 5000, stream: true });
    await stream.first;
    const drained = await call('POST', `${w.systemUrl}/engine/drain`, { reason: 'rebalance', deadline_ms: 100 });
    assert.equal(drained.status, 202);
    const lines = await stream.done;
    assert.match(lines.at(-1) ?? '', /"handoff"/, 'the stream was handed off at the deadline');
    await w.waitForEvent('audit', (l) => l.what === 'drained');
    const trail = await events(w.systemUrl);
    const handoff = trail.find((e) => e.what === 'handoff');
    assert.ok(handoff, `a handoff event in ${JSON.stringify(trail)}`);
    assert.equal(handoff.actor, '127.0.0.1');
    assert.equal(handoff.reason, 'rebalance');
    assert.equal(handoff.result, 'handed_off 1');
    assert.equal(trail[0]?.actor, '127.0.0.1');
    assert.deepEqual(trail.map((e) => e.what), ['drain', 'handoff', 'drained']);
  });

  it('SIGTERM is audited as a shutdown by "signal": started, then its outcome', async () => {
    const w = await startWorker(['--discovery', tempDiscoveryUrl(), '--shutdown-grace-ms', '0'], NO_TOKEN);
    started.push(w);
    w.signal('SIGTERM');
    assert.equal(await w.exitCode(), 0);
    const shutdowns = w.logs.filter((l) => l.event === 'audit' && l.what === 'shutdown');
    assert.deepEqual(shutdowns.map((l) => [l.actor, l.result, l.reason]), [
      ['signal', 'started', 'signal SIGTERM'],
      ['signal', 'completed', 'signal SIGTERM'],
    ]);
    assert.equal((shutdowns[1]?.detail as { exit_code?: number } | undefined)?.exit_code, 0);
  });

  it('streams status changes and audit events on /engine/status/events', async () => {
    const w = await startWorker(['--discovery', tempDiscoveryUrl()], NO_TOKEN);
    started.push(w);
    const s = await openEventStream(`${w.systemUrl}/engine/status/events`);
    try {
      const first = await s.waitFor((e) => e.event === 'status', 'the current status');
      assert.equal(first.data.state, 'serving');
      await call('POST', `${w.systemUrl}/engine/drain`, { reason: 'streamed' });
      await s.waitFor((e) => e.event === 'status' && e.data.state === 'drained', 'drained');
      const audit = await s.waitFor((e) => e.event === 'audit' && e.data.what === 'drain', 'the drain audit event');
      assert.equal(audit.data.reason, 'streamed');
    } finally {
      s.close();
    }
  });
});

describe('audit trail and status through the frontend: GET /workers/events', () => {
  it('carries joins, the workers own status and audit events, and leaves', async () => {
    const discovery = tempDiscoveryUrl();
    const tokens = tokenFile('carol:tok-carol\n');
    const w = await startWorker(['--discovery', discovery, '--admin-token-file', tokens], NO_TOKEN);
    started.push(w);
    const fe = await startFrontend(discovery, ['--admin-port', '0', '--admin-token-file', tokens], NO_TOKEN);
    started.push(fe);
    const adminUrl = (await fe.waitForEvent('frontend_ready')).admin_url as string;
    await fe.waitForLog((l) => (l.event === 'discovery_reset' && (l.workers as string[]).includes(w.workerId)) || (l.event === 'worker_added' && l.worker_id === w.workerId), 'frontend sees the worker');

    const s = await openEventStream(`${adminUrl}/workers/events`, bearer('tok-carol'));
    try {
      const snapshot = await s.waitFor((e) => e.event === 'snapshot', 'snapshot');
      assert.deepEqual(snapshot.data.workers.map((x: { worker_id: string }) => x.worker_id), [w.workerId]);
      await s.waitFor((e) => e.event === 'status' && e.data.worker_id === w.workerId, "the worker's first status");

      const refused = await call('POST', `${adminUrl}/workers/${w.workerId}/drain`, { reason: 'x' }, { origin: 'http://evil.example' , ...bearer('tok-carol') });
      assert.equal(refused.status, 403, 'a cross-origin admin POST is refused');
      const drain = await call('POST', `${adminUrl}/workers/${w.workerId}/drain`, { reason: 'via frontend' }, bearer('tok-carol'));
      assert.ok(drain.status === 200 || drain.status === 202, `got ${drain.status}`);
      await s.waitFor((e) => e.event === 'status' && e.data.worker_id === w.workerId && e.data.status.state === 'drained', 'drained, pushed');
      const audit = await s.waitFor((e) => e.event === 'audit' && e.data.event.what === 'drain', 'the drain audit event');
      assert.equal(audit.data.worker_id, w.workerId);
      assert.equal(audit.data.event.actor, 'carol');
      assert.equal(audit.data.event.reason, 'via frontend');
      await s.waitFor((e) => e.event === 'worker_left' && e.data.worker_id === w.workerId, 'worker_left (it unregistered)');

      await call('POST', `${adminUrl}/workers/${w.workerId}/resume`, undefined, bearer('tok-carol'));
      await s.waitFor((e) => e.event === 'worker_joined' && e.data.worker.worker_id === w.workerId, 'worker_joined again');
    } finally {
      s.close();
    }
  });
});
