import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { bounded, frontendSeesWorkers, startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle } from './helpers/processes.js';
import { redisSkipReason, startRedis, type RedisServer } from './helpers/redis.js';

/**
 * Responses that belong to their tenant and outlive their frontend (issue 42 items 6 and 7): a
 * background response whose frontend is killed or restarted is continued by another; a cancel
 * asked anywhere stops it; with --api-key-file, one key cannot read, resume, cancel or continue
 * another key's responses and streams, in one frontend's memory or across a fleet.
 */
describe('the Responses API across a fleet: background responses outlive their frontend, and belong to their tenant', { skip: redisSkipReason() }, () => {
  const started: EbbProcess[] = [];
  let redis: RedisServer;
  let discovery: string;
  let keys: string;
  let b: FrontendHandle;
  before(async () => {
    redis = await startRedis();
    discovery = tempDiscoveryUrl();
    keys = join(mkdtempSync(join(tmpdir(), 'ebb-keys-')), 'keys');
    writeFileSync(keys, 'team-a:sk-ebb-a\nteam-b:sk-ebb-b\n', { mode: 0o600 });
    started.push(...(await Promise.all([0, 1].map(() => startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '20', '--mocker-ttft-ms', '0', '--mocker-max-context', '100000'])))));
    b = await frontend();
  });
  after(async () => {
    await Promise.all(started.map((p) => p.stop()));
    await redis?.stop();
  });

  async function frontend(args: string[] = []): Promise<FrontendHandle> {
    const f = await startFrontend(discovery, ['--stream-store', redis.url, '--api-key-file', keys, ...args]);
    started.push(f);
    await frontendSeesWorkers(f, 2);
    return f;
  }
  const as = (f: FrontendHandle, key = 'sk-ebb-a') => new OpenAI({ baseURL: `${f.url}/v1`, apiKey: key, maxRetries: 0, defaultHeaders: { 'x-ebb-resumable': '1' } });
  /** Polls the response at `f` until it is over; its final object. */
  const settled = (f: FrontendHandle, id: string) =>
    bounded(
      (async () => {
        for (;;) {
          const r = await as(f).responses.retrieve(id);
          if (r.status !== 'in_progress' && r.status !== 'queued') return r;
          await sleep(100);
        }
      })(),
      `response ${id} to end`,
      60_000,
    );
  const request = { model: 'm1', input: 'tell me about the tides', max_output_tokens: 120 };

  it('a background response whose frontend is SIGKILLed: polled at another frontend, continued there, completed whole', async () => {
    const undisturbed = await as(b).responses.create(request);
    const a = await frontend();
    const queued = await as(a).responses.create({ ...request, background: true });
    for await (const ev of await as(a).responses.retrieve(queued.id, { stream: true })) if (ev.type === 'response.output_text.delta') break;
    a.proc.kill('SIGKILL');
    const done = await settled(b, queued.id);
    assert.equal(done.status, 'incomplete', 'it ran to its max_output_tokens');
    assert.equal(done.output_text, undisturbed.output_text, 'the whole text, as undisturbed');
  });

  it('a background response whose frontend stops gracefully: handed on, another frontend continues it at once', async () => {
    // Long enough to be running when its frontend's shutdown gets to it (the undisturbed run alongside).
    const long = { ...request, max_output_tokens: 600 };
    const a = await frontend(['--shutdown-grace-ms', '0']);
    const undisturbed = as(b).responses.create(long);
    const queued = await as(a).responses.create({ ...long, background: true });
    for await (const ev of await as(a).responses.retrieve(queued.id, { stream: true })) if (ev.type === 'response.output_text.delta') break;
    const mark = b.mark();
    a.proc.kill('SIGTERM');
    await b.waitForEvent('stream_taken_over', (l) => l.response_id === queued.id, { after: mark });
    const done = await settled(b, queued.id);
    assert.equal(done.output_text, (await undisturbed).output_text);
  });

  it('a cancel asked at another frontend stops a background response wherever it runs, and one whose frontend died', async () => {
    const a = await frontend();
    const running = await as(a).responses.create({ ...request, max_output_tokens: 2000, background: true });
    const orphan = await as(a).responses.create({ ...request, max_output_tokens: 2000, background: true });
    for (const id of [running.id, orphan.id]) for await (const ev of await as(a).responses.retrieve(id, { stream: true })) if (ev.type === 'response.output_text.delta') break;
    // A client follows the running one at the other frontend: it is told how it ended, never cut silently.
    const follower = (async () => {
      const types: string[] = [];
      try {
        for await (const ev of await as(b).responses.retrieve(running.id, { stream: true, starting_after: 3 })) types.push(ev.type);
      } catch (err) {
        return { types, err };
      }
      return { types, err: undefined };
    })();
    assert.equal((await as(b).responses.cancel(running.id)).status, 'cancelled', 'cancelled at the frontend that runs it');
    assert.equal((await as(a).responses.retrieve(running.id)).status, 'cancelled');
    const followed = await follower;
    assert.ok(followed.err instanceof OpenAI.APIError && /cancelled/.test(String(followed.err.code ?? followed.err.message)), `the follower elsewhere got the stop as an error the SDK raises: ${String(followed.err)} after ${followed.types.slice(-2).join(', ')}`);
    a.proc.kill('SIGKILL');
    assert.equal((await as(b).responses.cancel(orphan.id)).status, 'cancelled', 'its frontend gone: stopped here');
    assert.equal((await as(b).responses.retrieve(orphan.id)).status, 'cancelled');
  });

  for (const where of ['at its own frontend (memory)', 'at another frontend (the shared store)'] as const) {
    it(`another tenant's key ${where}: its responses and streams are never heard of (404), its previous_response_id refused`, async () => {
      const a = await frontend();
      const other = where.startsWith('at its own') ? a : b;
      const stored = await as(a).responses.create({ ...request, max_output_tokens: 4 });
      const background = await as(a).responses.create({ ...request, max_output_tokens: 2000, background: true });
      const chatStream = await as(a).chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'tides' }], max_tokens: 2000, stream: true });
      let chatId = '';
      for await (const chunk of chatStream) {
        chatId = chunk.id;
        break;
      }
      const intruder = as(other, 'sk-ebb-b');
      for (const [what, call] of [
        ['retrieve', () => intruder.responses.retrieve(stored.id)],
        ['retrieve a background one', () => intruder.responses.retrieve(background.id)],
        ['resume a background one', () => intruder.responses.retrieve(background.id, { stream: true })],
        ['cancel', () => intruder.responses.cancel(background.id)],
      ] as const)
        await assert.rejects(call(), (err: unknown) => err instanceof OpenAI.NotFoundError, `${what}: 404`);
      const resumed = await fetch(`${other.url}/v1/chat/completions/${chatId}?stream=true`, { headers: { authorization: 'Bearer sk-ebb-b' } });
      assert.equal(resumed.status, 404, `resume a chat stream: ${await resumed.text()}`);
      await assert.rejects(intruder.responses.create({ ...request, previous_response_id: stored.id }), (err: unknown) => err instanceof OpenAI.BadRequestError && /previous_response_id/.test(err.message));
      // Its own tenant still has them all.
      assert.equal((await as(other).responses.retrieve(stored.id)).id, stored.id);
      assert.equal((await as(other).responses.cancel(background.id)).status, 'cancelled');
    });
  }
});
