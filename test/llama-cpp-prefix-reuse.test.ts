/**
 * `--engine llama-cpp` reuses prompt prefixes across requests (as llama.cpp's server does): a
 * request takes the free sequence with the longest common prefix and evaluates only the rest,
 * answers exactly as without reuse at temperature 0, reports cached_tokens, and publishes the
 * blocks its sequences hold on GET /kv/events. One real worker process, the tiny generated GGUF.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { blockHashes } from '../src/protocol/block-hash.js';
import { call } from './helpers/http.js';
import { openEventStream, type EventStream } from './helpers/event-stream.js';
import { writeTinyLlamaGguf } from './helpers/gguf.js';
import { startWorker, tempDiscoveryUrl, type WorkerHandle } from './helpers/processes.js';

const MODEL = 'tiny';
const DOC = 'the tide comes in and the tide goes out, over and over, on the quiet shore of the river harbor. '.repeat(4);
const Q1 = `${DOC}what does the river carry to the sea?`;
const Q2 = `${DOC}where does the harbor light shine at night?`;

interface Answer {
  text: string;
  usage: { prompt_tokens: number; completion_tokens: number; prompt_tokens_details?: { cached_tokens: number } };
}

describe('llama-cpp prefix reuse', () => {
  let w: WorkerHandle;
  let discoveryDir: string;
  let stream: EventStream;
  const generate = async (body: Record<string, unknown>): Promise<Answer> => {
    const res = await call('POST', `${w.requestUrl}/generate`, { model: MODEL, temperature: 0, max_tokens: 24, stream: false, ...body });
    assert.equal(res.status, 200, JSON.stringify(res.body));
    return res.body as Answer;
  };
  const tokenize = async (body: Record<string, unknown>): Promise<number[]> => {
    const res = await call('POST', `${w.requestUrl}/tokenize`, { model: MODEL, ...body });
    assert.equal(res.status, 200, JSON.stringify(res.body));
    return res.body.token_ids as number[];
  };
  /** The blocks the worker says it holds now (a fresh snapshot). */
  const held = async (): Promise<Set<number>> => {
    const s = await openEventStream(`${w.systemUrl}/kv/events`);
    try {
      return new Set((await s.waitFor((e) => e.event === 'snapshot', 'a snapshot')).data.blocks as number[]);
    } finally {
      s.close();
    }
  };

  before(async () => {
    const url = tempDiscoveryUrl();
    discoveryDir = fileURLToPath(url);
    const args = ['--engine', 'llama-cpp', '--model-path', writeTinyLlamaGguf(), '--model', MODEL, '--threads', '1', '--gpu', 'off', '--context-size', '1024', '--parallel', '2'];
    w = await startWorker(['--discovery', url, ...args]);
    stream = await openEventStream(`${w.systemUrl}/kv/events`);
    await stream.waitFor((e) => e.event === 'snapshot', 'the first snapshot');
  });
  after(async () => {
    stream?.close();
    await w?.stop();
  });

  it('declares its prefix cache: blocks of 16 of its own tokens, exact events', () => {
    const record = JSON.parse(readFileSync(join(discoveryDir, `${w.workerId}.json`), 'utf8')).record;
    assert.deepEqual(record.kv_cache, { block_size: 16, tokenizer: 'worker', events: 'exact' });
  });

  it('evaluates only what a sequence does not hold, and answers exactly as without reuse (temperature 0)', async () => {
    // Cold: nothing is cached, the whole prompt is evaluated.
    const cold = await generate({ prompt: Q2 });
    assert.equal(cold.usage.prompt_tokens_details?.cached_tokens, 0);
    // Another question on the same document reuses the document's tokens...
    const q1 = await generate({ prompt: Q1 });
    const common = (await tokenize({ prompt: DOC })).length;
    assert.ok((q1.usage.prompt_tokens_details?.cached_tokens ?? 0) >= common - 2, `the document's ${common} tokens were reused (${q1.usage.prompt_tokens_details?.cached_tokens})`);
    assert.ok((q1.usage.prompt_tokens_details?.cached_tokens ?? 0) < q1.usage.prompt_tokens);
    // ...and Q2 again, now on a sequence whose tail was overwritten by Q1: only its question is evaluated.
    const warm = await generate({ prompt: Q2 });
    assert.ok((warm.usage.prompt_tokens_details?.cached_tokens ?? 0) > 0 && (warm.usage.prompt_tokens_details?.cached_tokens ?? 0) < warm.usage.prompt_tokens, `partly cached: ${warm.usage.prompt_tokens_details?.cached_tokens}`);
    assert.equal(warm.text, cold.text, 'the same answer with and without reuse');
    assert.deepEqual(warm.usage.prompt_tokens, cold.usage.prompt_tokens);
    // The very same prompt once more: all but the last token come from the cache.
    const again = await generate({ prompt: Q2 });
    assert.equal(again.usage.prompt_tokens_details?.cached_tokens, again.usage.prompt_tokens - 1);
    assert.equal(again.text, cold.text);
  });

  it('POST /tokenize gives the tokens generate evaluates: plain and chat (the model\'s template)', async () => {
    const messages = [{ role: 'system', content: 'answer briefly' }, { role: 'user', content: 'where is the harbor?' }];
    const ids = await tokenize({ messages });
    const chat = await generate({ messages });
    assert.equal(ids.length, chat.usage.prompt_tokens);
    const plain = await tokenize({ prompt: Q1 });
    const answer = await generate({ prompt: Q1 });
    assert.equal(plain.length, answer.usage.prompt_tokens);
  });

  it('publishes the blocks its sequences hold: a prompt\'s blocks are held, a tail overwritten by another prompt is removed', async () => {
    // Both sequences are taken by prompts that share nothing, so the Q1/Q2 tails must go.
    const other1 = 'a completely different text about gulls and sand and salt and the moon over the water. '.repeat(3);
    const other2 = 'steady light of the harbor in the quiet night, a story told twice and then again. '.repeat(3);
    const at = stream.events.length;
    await Promise.all([generate({ prompt: other1, max_tokens: 4 }), generate({ prompt: other2, max_tokens: 4 })]);
    const now = await held();
    for (const h of blockHashes(await tokenize({ prompt: other1 }))) assert.ok(now.has(h), 'every full block of the prompt is held');
    for (const h of blockHashes(await tokenize({ prompt: other2 }))) assert.ok(now.has(h));
    for (const h of blockHashes(await tokenize({ prompt: Q2 }))) assert.ok(!now.has(h), 'blocks no sequence holds any more are gone');
    const gone = stream.events.slice(at).flatMap((e) => (e.event === 'kv' ? e.data.events : [])).filter((e: any) => e.type === 'removed').flatMap((e: any) => e.block_hashes);
    // Q1 ran last on its sequence (the previous test): its blocks went in this window.
    const q1Blocks = blockHashes(await tokenize({ prompt: Q1 }));
    assert.ok(q1Blocks.every((h) => !now.has(h) && gone.includes(h)), 'and their removal was published');
    const status = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(status.body.kv_cache.cached_blocks, now.size);
    assert.equal(status.body.kv_cache.block_size, 16);
    assert.ok(status.body.kv_cache.prompt_tokens_hit > 0 && status.body.kv_cache.hit_rate > 0 && status.body.kv_cache.hit_rate < 1);
  });
});
