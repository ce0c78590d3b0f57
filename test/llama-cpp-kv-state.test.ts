/**
 * The llama-cpp engine's KV state files, in process: a prefill's state loads into another
 * sequence and the answer equals a full evaluation; a corrupt, foreign or oversized state is
 * refused (an oversized one before a byte is read) before it reaches llama.cpp; files go on confirm, on expiry and on close.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { existsSync, readFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { loadLlamaCppEngine, type LlamaCppEngine, type LlamaCppOptions } from '../src/engine/llama-cpp.js';
import type { GenerateRequest } from '../src/engine/engine.js';
import { KvStateRefused, type KvStateHeader } from '../src/engine/llama-cpp-kv-state.js';
import { createLogger } from '../src/common/logger.js';
import { writeTinyLlamaGguf } from './helpers/gguf.js';
import { drainGeneration } from './helpers/generation.js';
import { bounded } from './helpers/processes.js';

const modelPath = writeTinyLlamaGguf();
// The default TTL (30 s): a state a test still holds must not expire under a loaded machine.
const options: LlamaCppOptions = { modelPath, parallel: 2, maxQueue: 4, contextSize: 512, threads: 1, gpu: 'off' };
/** Short enough to wait for, long enough that the check before it cannot miss it on a loaded machine. */
const SHORT_TTL_MS = 5000;

const drain = drainGeneration;

async function* chunks(buf: Buffer): AsyncGenerator<Uint8Array> {
  yield buf.subarray(0, 100);
  yield buf.subarray(100);
}

describe('llama-cpp KV state files', () => {
  let engine: LlamaCppEngine;
  const live = new AbortController().signal;
  before(async () => {
    engine = await loadLlamaCppEngine(options, createLogger('test'), live);
  });
  after(async () => {
    await engine?.close();
  });

  const request = (extra: Partial<GenerateRequest> = {}): GenerateRequest => ({
    request_id: 'r',
    prompt: 'hello world, tell me about the tides and the moon',
    max_tokens: 24,
    temperature: 0,
    ...extra,
  });

  it('a prefill state loads into a fresh sequence: same answer, the prompt but its last token not evaluated, files removed on confirm', async () => {
    const full = await drain(engine.generate(request(), live));
    const t = await engine.prefill(request(), live);
    const payload = engine.kvPayload(t.transfer_id);
    assert.ok(payload, 'the transfer has a payload');
    assert.ok(existsSync(payload.path));
    assert.equal(engine.stats().kv_state_bytes, payload.bytes);
    const header = JSON.parse(payload.header) as KvStateHeader;
    assert.equal(header.tokens, full.result.prompt_tokens - 1);
    const bytes = readFileSync(payload.path);

    const handle = await engine.importKv(payload.header, payload.bytes, chunks(bytes), live);
    assert.equal(engine.stats().kv_state_bytes, 2 * payload.bytes, 'the pulled copy counts too');
    // As the worker passes a prefill peer's state on: with what that peer found cached, which the
    // usage reports (not the prompt the state brought).
    assert.equal(typeof t.cached_tokens, 'number');
    const fromKv = await drain(engine.generate(request({ kv_state: handle, prefilled: true, prefill_cached_tokens: t.cached_tokens }), live));
    assert.equal(fromKv.text, full.text);
    assert.equal(fromKv.result.cached_tokens, t.cached_tokens, 'what the prefill found cached');
    assert.equal(existsSync(handle.path), false, 'the pulled file goes once loaded');

    assert.equal(engine.kvTransfers.complete(t.transfer_id), true);
    assert.equal(existsSync(payload.path), false, 'confirmed: the file goes');
    assert.equal(engine.stats().kv_state_bytes, 0);
    assert.deepEqual(await engine.probeQuiescence(), { state: 'idle' });
  });

  it('refuses a corrupt, foreign, larger-context or mis-sized state before llama.cpp sees it', async () => {
    const t = await engine.prefill(request(), live);
    const payload = engine.kvPayload(t.transfer_id)!;
    const bytes = readFileSync(payload.path);
    const header = JSON.parse(payload.header) as KvStateHeader;
    const corrupt = Buffer.from(bytes);
    corrupt[corrupt.length >> 1]! ^= 0xff;
    const refuse = (h: Partial<KvStateHeader>, body: Buffer, declared = body.length, why: RegExp) =>
      assert.rejects(engine.importKv(JSON.stringify({ ...header, ...h }), declared, chunks(body), live), (err: Error) => err instanceof KvStateRefused && why.test(err.message));
    await refuse({}, corrupt, undefined, /corrupt/);
    await refuse({ model_sha256: '0'.repeat(64) }, bytes, undefined, /another model/);
    await refuse({ context_size: 4096 }, bytes, undefined, /larger than this engine/);
    await refuse({}, bytes, bytes.length + 1, /body is/);
    await refuse({}, Buffer.concat([bytes, Buffer.alloc(8)]), bytes.length, /more than/);
    await assert.rejects(engine.importKv('{"format":"other"}', bytes.length, chunks(bytes), live), KvStateRefused);
    assert.equal(engine.stats().kv_state_bytes, payload.bytes, 'refused states leave no file behind');
    assert.equal(engine.kvTransfers.complete(t.transfer_id), true);
  });

  it('refuses a state over the size bound, counting the states already held, before it reads a byte', async () => {
    const t = await engine.prefill(request(), live);
    const payload = engine.kvPayload(t.transfer_id)!;
    const bytes = readFileSync(payload.path);
    // Room for one state, not two: the bound counts what the receiver already holds.
    const receiver = await loadLlamaCppEngine({ ...options, kvStateMaxBytes: Math.floor(payload.bytes * 1.5) }, createLogger('test'), live);
    try {
      let read = false;
      async function* watched(): AsyncGenerator<Uint8Array> {
        read = true;
        yield* chunks(bytes);
      }
      const held = await receiver.importKv(payload.header, payload.bytes, chunks(bytes), live);
      assert.equal(receiver.stats().kv_state_bytes, payload.bytes);
      await assert.rejects(receiver.importKv(payload.header, payload.bytes, watched(), live), (err: Error) => {
        assert.ok(err instanceof KvStateRefused, `refused as KvStateRefused, got ${err.name}: ${err.message}`);
        assert.match(err.message, new RegExp(`a ${payload.bytes}-byte state would pass the bound of ${Math.floor(payload.bytes * 1.5)} bytes \\(${payload.bytes} in use\\)`));
        return true;
      });
      assert.equal(read, false, 'not a byte of a refused state is read');
      assert.equal(receiver.stats().kv_state_bytes, payload.bytes, 'the refused state is not counted and leaves no file');
      await held.dispose();
      const again = await receiver.importKv(payload.header, payload.bytes, chunks(bytes), live);
      assert.equal(receiver.stats().kv_state_bytes, payload.bytes, 'once the first is gone, the same state fits');
      await again.dispose();
    } finally {
      await receiver.close();
    }
    assert.equal(engine.kvTransfers.complete(t.transfer_id), true);
  });

  it('an unclaimed state expires with its TTL; the drain waits for it meanwhile; close removes the folder', async () => {
    const other = await loadLlamaCppEngine({ ...options, kvTransferTtlMs: SHORT_TTL_MS }, createLogger('test'), live);
    const t = await other.prefill(request(), live);
    const path = other.kvPayload(t.transfer_id)!.path;
    assert.deepEqual(await other.probeQuiescence(), { state: 'busy', waiting_for: ['1 pending KV transfer'] });
    const alive = setInterval(() => undefined, 1000); // the TTL's timer does not hold the process open
    await bounded(once(other.kvTransfers, 'expired'), `the state's expiry (TTL ${SHORT_TTL_MS} ms)`);
    clearInterval(alive);
    assert.equal(existsSync(path), false);
    assert.equal(other.stats().kv_state_bytes, 0);

    const kept = await other.prefill(request(), live);
    const dir = dirname(other.kvPayload(kept.transfer_id)!.path);
    await other.close();
    assert.equal(existsSync(dir), false, 'worker stop: the state folder is gone');
  });
});
