import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { call } from './helpers/http.js';
import { startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { streamCompletion } from './helpers/sse.js';
import { words } from './helpers/words.js';

/**
 * cached_tokens reach OpenAI clients: the mocker's prefix cache, through the request plane's done
 * line, into chat / completions / Responses usage, streamed and not, and after a migration.
 * One fleet: two workers (the second joins only for the migration case).
 */
const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

const WORKER_ARGS = ['--model', 'm1', '--mocker-ttft-ms', '0', '--mocker-max-context', '4096'];

let discovery: string;
let first: WorkerHandle;
let frontend: FrontendHandle;
let client: OpenAI;
before(async () => {
  discovery = tempDiscoveryUrl();
  // Slow enough that the migration case drains it mid-stream; the other cases ask for a few tokens.
  first = await startWorker(['--discovery', discovery, '--mocker-itl-ms', '10', ...WORKER_ARGS]);
  started.push(first);
  frontend = await startFrontend(discovery);
  started.push(frontend);
  client = new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'unused' });
});

describe('cached_tokens in OpenAI usage (openai SDK, real processes)', () => {
  it('chat: 0 on the first call, the whole blocks of the prompt on a repeat, streamed and not', async () => {
    const messages = [{ role: 'user' as const, content: words(200, 'chat') }]; // "user: ..." = 201 tokens
    const cold = await client.chat.completions.create({ model: 'm1', messages, max_tokens: 3 });
    assert.equal(cold.usage?.prompt_tokens, 201);
    assert.equal(cold.usage?.prompt_tokens_details?.cached_tokens, 0);
    const warm = await client.chat.completions.create({ model: 'm1', messages, max_tokens: 3 });
    assert.equal(warm.usage?.prompt_tokens_details?.cached_tokens, 192);
    let streamed: OpenAI.CompletionUsage | undefined;
    for await (const chunk of await client.chat.completions.create({ model: 'm1', messages, max_tokens: 3, stream: true, stream_options: { include_usage: true } })) {
      if (chunk.usage) streamed = chunk.usage;
    }
    assert.ok(streamed?.prompt_tokens_details?.cached_tokens !== undefined && streamed.prompt_tokens_details.cached_tokens >= 192, JSON.stringify(streamed));
  });

  it('completions: n choices count the prompt and its cached share once', async () => {
    const prompt = words(100, 'cmpl'); // 6 whole blocks within the first 99 tokens
    await client.completions.create({ model: 'm1', prompt, max_tokens: 2 });
    const r = await client.completions.create({ model: 'm1', prompt, max_tokens: 2, n: 3 });
    assert.equal(r.usage?.prompt_tokens, 100);
    assert.equal((r.usage as OpenAI.CompletionUsage & { prompt_tokens_details?: { cached_tokens?: number } }).prompt_tokens_details?.cached_tokens, 96);
  });

  it("completions: a prompt of whole blocks never hits its last block (its last token is always computed)", async () => {
    const prompt = words(32, 'whole'); // exactly 2 blocks of 16
    await client.completions.create({ model: 'm1', prompt, max_tokens: 2 });
    const r = await client.completions.create({ model: 'm1', prompt, max_tokens: 2 });
    assert.equal(r.usage?.prompt_tokens, 32);
    assert.equal((r.usage as OpenAI.CompletionUsage & { prompt_tokens_details?: { cached_tokens?: number } }).prompt_tokens_details?.cached_tokens, 16);
  });

  it('Responses API: input_tokens_details.cached_tokens, plain and streamed', async () => {
    const input = words(120, 'resp');
    await client.responses.create({ model: 'm1', input, max_output_tokens: 2 });
    const plain = await client.responses.create({ model: 'm1', input, max_output_tokens: 2 });
    assert.ok((plain.usage?.input_tokens_details.cached_tokens ?? 0) >= 112, JSON.stringify(plain.usage));
    let streamed: OpenAI.Responses.ResponseUsage | undefined;
    for await (const event of await client.responses.create({ model: 'm1', input, max_output_tokens: 2, stream: true })) {
      if (event.type === 'response.incomplete' || event.type === 'response.completed') streamed = event.response.usage ?? undefined;
    }
    assert.equal(streamed?.input_tokens_details.cached_tokens, plain.usage?.input_tokens_details.cached_tokens);
  });

  it('a migrated stream reports what the worker that finished it found cached', async () => {
    // A second worker that already holds the prompt, out of routing while the stream starts on the
    // first; back in routing when the first's drain deadline hands the stream off to it.
    const second = await startWorker(['--discovery', discovery, '--mocker-itl-ms', '0', ...WORKER_ARGS]);
    started.push(second);
    await frontend.waitForLog((l) => l.event === 'worker_added' && l.worker_id === second.workerId, 'the frontend sees the second worker');
    const messages = [{ role: 'user', content: words(200, 'moved') }];
    const warmed = await call('POST', `${second.requestUrl}/generate`, { model: 'm1', messages, max_tokens: 2, stream: false });
    assert.equal(warmed.status, 200);
    let cursor = frontend.mark();
    await call('POST', `${second.systemUrl}/engine/drain`, { persist: false });
    await frontend.waitForLog((l) => l.event === 'worker_removed' && l.worker_id === second.workerId, 'the second worker out of routing', { after: cursor });
    let progressed!: () => void;
    const atTen = new Promise<void>((r) => (progressed = r));
    const stream = streamCompletion(frontend.url, { model: 'm1', messages, max_tokens: 600, stream_options: { include_usage: true } }, undefined, (n) => {
      if (n === 10) progressed();
    });
    await atTen;
    cursor = frontend.mark();
    await call('POST', `${second.systemUrl}/engine/resume`);
    await frontend.waitForLog((l) => l.event === 'worker_added' && l.worker_id === second.workerId, 'the second worker back in routing', { after: cursor });
    await call('POST', `${first.systemUrl}/engine/drain`, { deadline_ms: 0, persist: false });
    const r = await stream;
    assert.equal(r.error, undefined, r.error);
    assert.equal(r.workerId, first.workerId, 'the stream started on the first worker');
    assert.equal(r.usage?.completion_tokens, 600);
    // The second held the prompt, "assistant:" and 2 answer words: 204 tokens, 12 whole blocks.
    assert.equal((r.usage as { prompt_tokens_details?: { cached_tokens: number } } | undefined)?.prompt_tokens_details?.cached_tokens, 192, JSON.stringify(r.usage));
  });
});
