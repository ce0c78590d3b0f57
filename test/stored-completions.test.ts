import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { startFrontend, startWorker, tempDiscoveryUrl, frontendSeesWorkers, type EbbProcess, type FrontendHandle } from './helpers/processes.js';

/**
 * Stored chat completions (issue 44 item 4), in one frontend's memory (a fleet sharing Redis:
 * responses-fleet.test.ts): `store: true` keeps the completion, and the openai SDK's retrieve,
 * update, delete, list (model and metadata filters, pages) and messages read it, each key its own.
 */
const started: EbbProcess[] = [];
let frontend: FrontendHandle;
let discovery: string;
before(async () => {
  discovery = tempDiscoveryUrl();
  const keys = join(mkdtempSync(join(tmpdir(), 'ebb-keys-')), 'keys');
  writeFileSync(keys, 'team-a:sk-ebb-a\nteam-b:sk-ebb-b\n', { mode: 0o600 });
  started.push(await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '0', '--mocker-ttft-ms', '0']));
  frontend = await startFrontend(discovery, ['--api-key-file', keys]);
  started.push(frontend);
  await frontendSeesWorkers(frontend, 1);
});
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

const as = (key = 'sk-ebb-a', f = frontend) => new OpenAI({ baseURL: `${f.url}/v1`, apiKey: key, maxRetries: 0 });
const ask = (content: string) => [{ role: 'user' as const, content }];
const notFound = (err: unknown) => err instanceof OpenAI.NotFoundError;

describe('stored chat completions: store true, then retrieve, update, list, messages and delete through the openai SDK', () => {
  it('a stored completion is retrieved as it was answered, its metadata updated, its messages listed, then deleted', async () => {
    const c = as();
    const messages = [{ role: 'system' as const, content: 'be brief' }, { role: 'user' as const, content: [{ type: 'text' as const, text: 'tell me about the tides' }] }];
    const made = await c.chat.completions.create({ model: 'm1', messages, max_tokens: 6, store: true, metadata: { topic: 'tides' } });
    const got = await c.chat.completions.retrieve(made.id);
    assert.deepEqual({ ...got, metadata: undefined }, { ...made, metadata: undefined }, 'retrieved as it was answered');
    assert.deepEqual((got as unknown as { metadata: unknown }).metadata, { topic: 'tides' });
    const updated = await c.chat.completions.update(made.id, { metadata: { topic: 'moon', reviewed: 'yes' } });
    assert.deepEqual((updated as unknown as { metadata: unknown }).metadata, { topic: 'moon', reviewed: 'yes' });
    assert.deepEqual((await c.chat.completions.retrieve(made.id) as unknown as { metadata: unknown }).metadata, { topic: 'moon', reviewed: 'yes' });
    const listed = [];
    for await (const m of c.chat.completions.messages.list(made.id)) listed.push(m);
    assert.deepEqual(
      listed.map((m) => [m.id, m.role, m.content, m.content_parts ?? null]),
      [
        [`${made.id}-0`, 'system', 'be brief', null],
        [`${made.id}-1`, 'user', 'tell me about the tides', [{ type: 'text', text: 'tell me about the tides' }]],
      ],
    );
    const newestFirst = await c.chat.completions.messages.list(made.id, { order: 'desc', limit: 1 });
    assert.deepEqual([newestFirst.data.map((m) => m.id), newestFirst.has_more], [[`${made.id}-1`], true]);
    assert.deepEqual(await c.chat.completions.delete(made.id), { id: made.id, object: 'chat.completion.deleted', deleted: true });
    await assert.rejects(c.chat.completions.retrieve(made.id), notFound, 'deleted: never heard of');
    await assert.rejects(c.chat.completions.delete(made.id), notFound);
    const unstored = await c.chat.completions.create({ model: 'm1', messages: ask('x'), max_tokens: 2 });
    await assert.rejects(c.chat.completions.retrieve(unstored.id), notFound, 'store absent: not stored, as OpenAI');
  });

  it('the list: its own completions in the order they were made, filtered by model and metadata, paged both ways', async () => {
    const c = as();
    const run = `run-${Date.now()}`;
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) ids.push((await c.chat.completions.create({ model: 'm1', messages: ask(`question ${i}`), max_tokens: 2, store: true, metadata: { run, parity: i % 2 === 0 ? 'even' : 'odd' } })).id);
    const all: string[] = [];
    // The SDK pages on by itself (after = the last id of each page).
    for await (const item of c.chat.completions.list({ metadata: { run }, limit: 2 })) all.push(item.id);
    assert.deepEqual(all, ids, 'oldest first, every page');
    const even = await c.chat.completions.list({ metadata: { run, parity: 'even' }, order: 'desc' });
    assert.deepEqual(even.data.map((x) => x.id), [ids[4], ids[2], ids[0]], 'both pairs must match; newest first');
    const page = await c.chat.completions.list({ metadata: { run }, limit: 2, after: ids[1] });
    assert.deepEqual([page.data.map((x) => x.id), page.has_more], [[ids[2], ids[3]], true]);
    assert.equal((await c.chat.completions.list({ metadata: { run }, model: 'another-model' })).data.length, 0, 'model filters');
    assert.equal((await c.chat.completions.list({ metadata: { run }, model: 'm1' })).data.length, 5);
    await assert.rejects(c.chat.completions.list({ limit: 101 }), (err: unknown) => err instanceof OpenAI.BadRequestError && err.param === 'limit');
    await assert.rejects(c.chat.completions.list({ after: 'chatcmpl-unknown' }), (err: unknown) => err instanceof OpenAI.BadRequestError && err.param === 'after');
  });

  it('a streamed completion is stored as its stream made it: its text, its tool calls joined, every choice', async () => {
    const c = as();
    let id = '';
    const text = ['', ''];
    const stream = await c.chat.completions.create({ model: 'm1', messages: ask('tell me about the tides'), max_tokens: 5, n: 2, store: true, stream: true, stream_options: { include_usage: true } });
    for await (const chunk of stream) {
      id = chunk.id;
      for (const ch of chunk.choices) text[ch.index] += ch.delta.content ?? '';
    }
    const stored = await c.chat.completions.retrieve(id);
    assert.deepEqual(stored.choices.map((ch) => [ch.index, ch.message.content, ch.finish_reason]), [[0, text[0], 'length'], [1, text[1], 'length']]);
    assert.equal(stored.usage?.completion_tokens, 10);
    const tools = [{ type: 'function' as const, function: { name: 'weather', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
    const called = c.chat.completions.stream({ model: 'm1', messages: ask('weather in Paris?'), tools, tool_choice: 'required', store: true });
    const final = await called.finalChatCompletion();
    const storedCall = await c.chat.completions.retrieve(final.id);
    assert.deepEqual(storedCall.choices[0]!.message.tool_calls, final.choices[0]!.message.tool_calls, 'the calls as the SDK joined them');
    assert.equal(storedCall.choices[0]!.finish_reason, 'tool_calls');
  });

  it('each key its own: another key is never told of it (404) and lists none of it', async () => {
    const mine = await as().chat.completions.create({ model: 'm1', messages: ask('secret'), max_tokens: 2, store: true, metadata: { owner: 'a' } });
    const intruder = as('sk-ebb-b');
    for (const [what, attempt] of [
      ['retrieve', () => intruder.chat.completions.retrieve(mine.id)],
      ['update', () => intruder.chat.completions.update(mine.id, { metadata: { owner: 'b' } })],
      ['delete', () => intruder.chat.completions.delete(mine.id)],
      ['messages', () => intruder.chat.completions.messages.list(mine.id)],
    ] as const)
      await assert.rejects(attempt(), notFound, `${what}: 404`);
    assert.equal((await intruder.chat.completions.list({ metadata: { owner: 'a' } })).data.length, 0);
    assert.deepEqual((await as().chat.completions.retrieve(mine.id) as unknown as { metadata: unknown }).metadata, { owner: 'a' }, 'untouched');
  });

  it('a frontend that keeps nothing (--stream-store none) refuses store: true naming it, never forgets silently', async () => {
    const none = await startFrontend(discovery, ['--stream-store', 'none']);
    started.push(none);
    await frontendSeesWorkers(none, 1);
    const c = as('unused', none);
    await assert.rejects(
      c.chat.completions.create({ model: 'm1', messages: ask('x'), max_tokens: 2, store: true }),
      (err: unknown) => err instanceof OpenAI.BadRequestError && err.param === 'store' && err.code === 'unsupported_parameter',
    );
    assert.equal((await c.chat.completions.create({ model: 'm1', messages: ask('x'), max_tokens: 2, store: false })).choices.length, 1);
  });
});
