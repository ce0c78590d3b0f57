import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { Redis } from 'ioredis';
import pino from 'pino';
import { RedisStore, parseStoreUrl } from '../src/frontend/streams/redis-store.js';
import { LEASE_MS, SharedStreams } from '../src/frontend/streams/shared-streams.js';
import { KeptStream } from '../src/frontend/streams/kept-stream.js';
import { LeaseLost } from '../src/frontend/streams/stream-lease.js';
import type { Release } from '../src/frontend/relay/held-bytes.js';
import { redisSkipReason, startRedis, type RedisServer } from './helpers/redis.js';

/** Every release the stream's gate makes, in order, and a wait for one that passes `mark` (or drops). */
function releases(stream: KeptStream) {
  const seen: Release[] = [];
  const waiters: Array<() => void> = [];
  stream.onRelease((upTo) => {
    seen.push(upTo);
    for (const w of waiters.splice(0)) w();
  });
  const passed = (mark: number) => seen.some((r) => r === 'drop' || r >= mark);
  return {
    seen,
    until: (mark: number, what: string) =>
      new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}; releases seen: ${JSON.stringify(seen)}`)), 15_000);
        const check = () => (passed(mark) ? (clearTimeout(timer), resolve()) : waiters.push(check));
        check();
      }),
  };
}

/**
 * A Redis-kept stream's end reaches its clients only once the fleet's copy holds it, as every batch
 * does; a writer that paused past its lease and woke to find its stream taken over learns it at the
 * end too: that end never goes out here (another frontend's continuation is the stream's one end),
 * and the stream is handed on, its client told where to resume. A real redis-server; the lease and
 * the kept stream as the frontend runs them; another frontend's takeover is its holder written over.
 */
describe("a kept stream's end waits for the copy, and a lost lease's end never goes out", { skip: redisSkipReason() }, () => {
  let redis: RedisServer;
  let shared: SharedStreams;
  let admin: Redis;
  let store: RedisStore;
  const log = pino({ level: 'silent' });
  before(async () => {
    redis = await startRedis();
    admin = new Redis(redis.url);
    store = new RedisStore(parseStoreUrl(redis.url), log, () => undefined, 'end-fence-test');
    await store.connect(10_000);
    shared = new SharedStreams(store, { owner: 'end-fence-test', windowMs: 60_000, maxResponseBytes: 1 << 20, writeTimeoutMs: 10_000, log });
  });
  after(async () => {
    await shared?.close();
    admin?.disconnect();
    await redis?.stop();
  });

  const hooks = { maxBytes: 1 << 20, graceMs: 60_000, writeTimeoutMs: 10_000, onBytes: () => undefined, onOver: () => undefined, onAbandoned: () => undefined };
  const kept = async (id: string) => {
    // Opened in the store by its first batch.
    const lease = shared.open(id, '{}', '');
    const stream = new KeptStream(id, hooks, '', lease);
    return { lease, stream, gate: releases(stream) };
  };
  /** Runs `then` right after the next single-stream batch is written to Redis, before any answer can be read; resolves after it. */
  const afterNextBatchWritten = (then: () => void) =>
    new Promise<void>((resolve) => {
      const client = store.client as unknown as { ebbAppend: (...args: unknown[]) => Promise<unknown> };
      const append = client.ebbAppend;
      client.ebbAppend = function (this: unknown, ...args: unknown[]) {
        client.ebbAppend = append;
        const answer = append.apply(this, args);
        // ioredis writes the command in an immediate queued just now; this one runs after it, before the loop polls again.
        setImmediate(() => (then(), resolve()));
        return answer;
      };
    });
  const entries = async (id: string) => (await admin.xrange(`ebb:{${id}}:events`, '-', '+')).map(([, f]) => f[f.indexOf('e') + 1]).join('');

  it('the end goes out once the copy holds it: the stream ends then, not before', async () => {
    const id = 'chatcmpl-endfence1';
    const { lease, stream, gate } = await kept(id);
    const first = stream.append(Buffer.from('id: 0\ndata: a\n\n'));
    assert.equal(typeof first, 'number', 'the first event waits for its batch');
    await gate.until(first as number, 'the first event copied');
    const end = stream.end(Buffer.from('id: 1\ndata: [DONE]\n\n'));
    assert.equal(typeof end, 'number', 'the end waits for the copy, as every batch');
    assert.equal(stream.current, 'live', 'not ended before the store has its end');
    await stream.endSettled;
    assert.equal(stream.current, 'ended');
    assert.equal(lease.current, 'finished');
    assert.ok(gate.seen.some((r) => r !== 'drop' && r >= (end as number)), `the end was released: ${JSON.stringify(gate.seen)}`);
    assert.equal(await entries(id), 'id: 0\ndata: a\n\nid: 1\ndata: [DONE]\n\n', 'the copy had it all when it went out');
  });

  it('taken over by another frontend before its end reached the store: the end is dropped, the lease lost, the stream handed on from what its client had', async () => {
    const id = 'chatcmpl-endfence2';
    const { lease, stream, gate } = await kept(id);
    const first = stream.append(Buffer.from('id: 0\ndata: a\n\n'));
    await gate.until(first as number, 'the first event copied');
    // Another frontend takes the stream over (this one paused past its lease), unseen here until its next step.
    await admin.hset(`ebb:{${id}}:meta`, 'holder', 'another-frontend');
    assert.equal(lease.valid, true, 'the lease still looks held here (its pause is not known to it)');
    const end = stream.end(Buffer.from('id: 1\ndata: [DONE]\n\n'));
    assert.equal(typeof end, 'number', 'the end waits for the copy');
    await stream.endSettled;
    assert.deepEqual(gate.seen.slice(-1), ['drop'], `the end never went out: ${JSON.stringify(gate.seen)}`);
    assert.equal(lease.current, 'lost');
    assert.ok(stream.signal.reason instanceof LeaseLost, 'the stream learned its lease was lost');
    assert.equal(stream.current, 'live', 'not ended here: its owner hands it on');
    const last = await stream.handOn((at) => Buffer.from(`id: ${at + 1}\ndata: interrupted\n\n`));
    assert.equal(last, 0, 'its client resumes after the last event it had');
    assert.equal(stream.current, 'handed_on');
    assert.equal(await entries(id), 'id: 0\ndata: a\n\n', 'the copy has no end from this writer');
  });

  it("stopped past its lease with a batch in flight: that batch's timeout, fired late at the wake, loses the lease (its clients get nothing unconfirmed, its end never goes out)", async () => {
    const id = 'chatcmpl-endfence3';
    const { lease, stream, gate } = await kept(id);
    const first = stream.append(Buffer.from('id: 0\ndata: a\n\n'));
    await gate.until(first as number, 'the first event copied');
    await admin.hset(`ebb:{${id}}:meta`, 'holder', 'another-frontend');
    redis.freeze();
    try {
      // The process stops (SIGSTOP, GC) past its lease once the batch is written, its answer unread:
      // at the wake the batch's command timeout fires (the store answers nothing here either way).
      const stopped = afterNextBatchWritten(() => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, LEASE_MS + 1_000));
      const second = stream.append(Buffer.from('id: 1\ndata: b\n\n'));
      assert.equal(typeof second, 'number', 'the second event waits for its batch');
      await stopped;
      await gate.until(second as number, 'the batch in flight to fail at the wake');
    } finally {
      redis.thaw();
    }
    assert.equal(lease.current, 'lost', 'the lease is lost, not run on uncopied (the store may have another writer)');
    assert.deepEqual(gate.seen.slice(-1), ['drop'], `the batch never went out: ${JSON.stringify(gate.seen)}`);
    assert.ok(stream.signal.reason instanceof LeaseLost, 'the stream learned its lease was lost');
    assert.equal(stream.end(Buffer.from('id: 2\ndata: [DONE]\n\n')), false, 'its end never goes out here');
    assert.equal(await admin.hget(`ebb:{${id}}:meta`, 'holder'), 'another-frontend', 'the other holder keeps it');
    assert.equal(await entries(id), 'id: 0\ndata: a\n\n', 'the copy has nothing more from this writer');
  });
});
