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

  it('background and streamed: its events from response.created (queued) on; the client leaves at one frontend, and starting_after at another gives the rest, as an undisturbed run has them', async () => {
    const a = await frontend();
    const kinds = (events: Array<{ type: string; sequence_number: number; delta?: unknown }>) => events.map((e) => [e.type, e.sequence_number, e.delta ?? null]);
    const undisturbed = [];
    for await (const e of await as(b).responses.create({ ...request, background: true, stream: true })) undisturbed.push(e);
    const first = [];
    for await (const e of await as(a).responses.create({ ...request, background: true, stream: true })) {
      first.push(e);
      if (e.type === 'response.output_text.delta' && first.length > 8) break;
    }
    assert.deepEqual([first[0]!.type, (first[0] as { response: { status: string } }).response.status, first[1]!.type], ['response.created', 'queued', 'response.queued']);
    const id = (first[0] as { response: { id: string } }).response.id;
    const rest = [];
    for await (const e of await as(b).responses.retrieve(id, { stream: true, starting_after: first.at(-1)!.sequence_number })) rest.push(e);
    assert.deepEqual(kinds([...first, ...rest]), kinds(undisturbed), 'the same events, numbered alike, the same text');
    assert.equal((await settled(b, id)).status, 'incomplete', 'it ran to its end with its client gone');
  });

  it('stored chat completions at any frontend of the fleet: made at one, retrieved, listed, updated and deleted at another; another key never hears of them', async () => {
    const a = await frontend();
    const run = `run-${Date.now()}`;
    const made = await as(a).chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'tell me about the tides' }], max_tokens: 4, store: true, metadata: { run } });
    let streamedId = '';
    for await (const chunk of await as(a).chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'and the moon' }], max_tokens: 4, store: true, metadata: { run }, stream: true })) streamedId = chunk.id;
    const got = await as(b).chat.completions.retrieve(made.id);
    assert.equal(got.choices[0]!.message.content, made.choices[0]!.message.content);
    const listed = [];
    for await (const c of as(b).chat.completions.list({ metadata: { run }, limit: 1 })) listed.push(c.id);
    assert.deepEqual(listed, [made.id, streamedId], 'both, oldest first, page by page');
    const messages = await as(b).chat.completions.messages.list(made.id);
    assert.deepEqual(messages.data.map((m) => m.content), ['tell me about the tides']);
    await as(b).chat.completions.update(made.id, { metadata: { run, seen: 'b' } });
    assert.deepEqual((await as(a).chat.completions.retrieve(made.id) as unknown as { metadata: unknown }).metadata, { run, seen: 'b' }, 'updated at b, read at a');
    const intruder = as(a, 'sk-ebb-b');
    await assert.rejects(intruder.chat.completions.retrieve(made.id), (err: unknown) => err instanceof OpenAI.NotFoundError);
    await assert.rejects(intruder.chat.completions.delete(made.id), (err: unknown) => err instanceof OpenAI.NotFoundError);
    assert.equal((await intruder.chat.completions.list({ metadata: { run } })).data.length, 0);
    await as(b).chat.completions.delete(made.id);
    await assert.rejects(as(a).chat.completions.retrieve(made.id), (err: unknown) => err instanceof OpenAI.NotFoundError, 'deleted at b: gone at a');
    assert.deepEqual((await as(a).chat.completions.list({ metadata: { run } })).data.map((c) => c.id), [streamedId]);
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

  it('a stored chat stream whose frontend is SIGKILLed mid-stream is stored by the frontend that finishes it, whole', async () => {
    const a = await frontend();
    const run = `taken-${Date.now()}`;
    const stream = await as(a).chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'tell me about the tides' }], max_tokens: 60, store: true, metadata: { run }, stream: true, stream_options: { include_usage: true } });
    const chunks = stream[Symbol.asyncIterator]();
    const id = ((await chunks.next()).value as { id: string }).id;
    for (let i = 0; i < 4; i++) await chunks.next();
    // Followed at b from the fleet's copy, then its frontend dies: another frontend continues it to its end.
    const follow = await fetch(`${b.url}/v1/chat/completions/${id}?stream=true`, { headers: { authorization: 'Bearer sk-ebb-a' } });
    assert.equal(follow.status, 200);
    a.proc.kill('SIGKILL');
    const events = await bounded(follow.text(), `the stream ${id} to end at b`, 60_000);
    const text = events
      .split('\n')
      .filter((l) => l.startsWith('data: {'))
      .map((l) => (JSON.parse(l.slice('data: '.length)) as { choices: Array<{ delta?: { content?: string } }> }).choices[0]?.delta?.content ?? '')
      .join('');
    assert.ok(events.includes('"finish_reason":"length"'), 'it ran to its end');
    // Stored as it ended at the frontend that finished it: read at b until it is there.
    const stored = await bounded(
      (async () => {
        for (;;) {
          const got = await as(b).chat.completions.retrieve(id).catch((err: unknown) => (err instanceof OpenAI.NotFoundError ? undefined : Promise.reject(err)));
          if (got !== undefined) return got;
          await sleep(100);
        }
      })(),
      `chat completion ${id} to be stored`,
      30_000,
    );
    assert.deepEqual([stored.choices[0]!.message.content, stored.choices[0]!.finish_reason, (stored as unknown as { metadata: unknown }).metadata], [text, 'length', { run }], 'the whole text, as its client got it');
    assert.equal(stored.usage?.completion_tokens, 60, 'its usage, from the stream\'s last chunk');
  });

  it('a background response whose frontend dies while it is queued (before any worker took it) is continued elsewhere with its whole opening', async () => {
    // Last of the file: a third worker, which frontends made after it would count. A model whose only worker is drained: its requests wait in the admission queue.
    const a = await frontend();
    const w = await startWorker(['--discovery', discovery, '--model', 'm9', '--mocker-itl-ms', '20', '--mocker-ttft-ms', '0']);
    started.push(w);
    await frontendSeesWorkers(a, 3);
    await frontendSeesWorkers(b, 3);
    const [markA, markB] = [a.mark(), b.mark()];
    assert.equal((await fetch(`${w.systemUrl}/engine/drain`, { method: 'POST' }).then((r) => r.json()) as { state: string }).state, 'drained');
    for (const [f, mark] of [[a, markA], [b, markB]] as const) await f.waitForEvent('worker_removed', (l) => l.worker_id === w.workerId, { after: mark });
    const queued = await as(a).responses.create({ model: 'm9', input: 'tell me about the tides', max_output_tokens: 12, background: true, stream: true });
    const seen = [];
    for await (const e of queued) {
      seen.push(e);
      if (seen.length === 2) break;
    }
    const id = (seen[0] as { response: { id: string } }).response.id;
    // Followed at b from the fleet's copy: its two first events are there before a goes.
    const follow = await as(b).responses.retrieve(id, { stream: true });
    const events = follow[Symbol.asyncIterator]();
    const copied = [(await events.next()).value, (await events.next()).value] as Array<{ type: string }>;
    assert.deepEqual(copied.map((e) => e.type), ['response.created', 'response.queued']);
    a.proc.kill('SIGKILL');
    await b.waitForEvent('stream_taken_over', (l) => l.response_id === id, { after: markB, boundMs: 30_000 });
    assert.equal((await fetch(`${w.systemUrl}/engine/resume`, { method: 'POST' }).then((r) => r.json()) as { state: string }).state, 'serving');
    const rest: Array<{ type: string; sequence_number: number }> = [];
    for (let e = await events.next(); !e.done; e = await events.next()) rest.push(e.value as { type: string; sequence_number: number });
    assert.deepEqual(
      rest.slice(0, 3).map((e) => [e.type, e.sequence_number]),
      [['response.in_progress', 2], ['response.output_item.added', 3], ['response.content_part.added', 4]],
      'its opening, numbered after the copy',
    );
    assert.equal(rest.filter((e) => e.type === 'response.output_text.delta').length, 12);
    assert.equal(rest.at(-1)!.type, 'response.incomplete');
  });
});
