import { describe, it, before, after, mock } from 'node:test';
import assert from 'node:assert/strict';
import { Redis } from 'ioredis';
import pino from 'pino';
import { RedisStore, parseStoreUrl } from '../src/frontend/streams/redis-store.js';
import { SharedStreams } from '../src/frontend/streams/shared-streams.js';
import { BATCH_MS } from '../src/frontend/streams/stream-lease.js';
import { redisSkipReason, scriptsRun, startRedis, type RedisServer } from './helpers/redis.js';
import type { Release } from '../src/frontend/relay/held-bytes.js';

// Captured before the timers are mocked: the bounds below still run on real time.
const realSetTimeout = globalThis.setTimeout;
const realClearTimeout = globalThis.clearTimeout;
/** Real time passing (not an event waited for): a batch at least BATCH_MS old. */
const pastBatchSpacing = () => new Promise((resolve) => realSetTimeout(resolve, BATCH_MS + 5));

/** Resolves once the gate released `mark` (or everything), rejects saying what it waited for. */
function released(lease: { gate: { onRelease(fn: (upTo: Release) => void): void } }, mark: number, what: string): Promise<Release> {
  return new Promise((resolve, reject) => {
    const timer = realSetTimeout(() => reject(new Error(`timed out: ${what}`)), 15_000);
    lease.gate.onRelease((upTo) => {
      if (upTo === 'drop' || upTo >= mark) {
        realClearTimeout(timer);
        resolve(upTo);
      }
    });
  });
}

/**
 * A Redis-kept stream's events reach its clients once the copy holds them (the copy gate, issue 42),
 * and no later: a batch goes at once when there is one, none is in flight and the last went at least
 * BATCH_MS ago (the first at once), not at the next tick of a batch timer (issue 47 item 1).
 * setTimeout is mocked here and never advances: whatever waited on the timer would never be
 * released. A real redis-server, the lease as the frontend runs it.
 */
describe('a Redis-kept stream is copied as it comes: one batch in flight, none waiting on a timer', { skip: redisSkipReason() }, () => {
  let redis: RedisServer;
  let shared: SharedStreams;
  let admin: Redis;
  before(async () => {
    redis = await startRedis();
    admin = new Redis(redis.url);
    const log = pino({ level: 'silent' });
    const store = new RedisStore(parseStoreUrl(redis.url), log, () => undefined, 'pipeline-test');
    await store.connect(10_000);
    // setInterval too, before the streams' renewal timer is made: no renewal runs among the scripts counted here.
    mock.timers.enable({ apis: ['setTimeout', 'setInterval'] });
    shared = new SharedStreams(store, { owner: 'pipeline-test', windowMs: 60_000, maxResponseBytes: 1 << 20, writeTimeoutMs: 10_000, log });
  });
  after(async () => {
    mock.timers.reset();
    await shared?.close();
    admin?.disconnect();
    await redis?.stop();
  });

  const entries = async (id: string) => (await admin.xrange(`ebb:{${id}}:events`, '-', '+')).map(([, f]) => f[f.indexOf('e') + 1]);

  it("the first event goes out once Redis holds it, with no timer's tick; events written while a batch is in flight go in the next one, together", async () => {
    const id = 'chatcmpl-pipeline1';
    const lease = shared.open(id, '{}', '');
    const first = lease.append(Buffer.from('id: 0\ndata: a\n\n'));
    assert.ok(first !== undefined, 'the gate holds the first event for its batch');
    await released(lease, first, 'the first event released (its batch answered) with setTimeout never firing');
    assert.deepEqual(await entries(id), ['id: 0\ndata: a\n\n'], 'the copy held it before it went out');

    // Redis answers nothing: the next batch is in flight; what comes meanwhile waits for its answer.
    await pastBatchSpacing();
    redis.freeze();
    let second: number | undefined;
    let last: number | undefined;
    try {
      second = lease.append(Buffer.from('id: 1\ndata: b\n\n'));
      await new Promise((resolve) => setImmediate(resolve));
      lease.append(Buffer.from('id: 2\ndata: c\n\n'));
      await new Promise((resolve) => setImmediate(resolve));
      last = lease.append(Buffer.from('id: 3\ndata: d\n\n'));
      await new Promise((resolve) => setImmediate(resolve));
      await pastBatchSpacing();
    } finally {
      redis.thaw();
    }
    await released(lease, second!, 'the batch sent while Redis was frozen answered once it thawed');
    await released(lease, last!, 'the events written while it was in flight released, with setTimeout never firing');
    assert.deepEqual(await entries(id), ['id: 0\ndata: a\n\n', 'id: 1\ndata: b\n\n', 'id: 2\ndata: c\n\nid: 3\ndata: d\n\n'], 'three batches: the first, the one in flight, then all written meanwhile as one');
    await lease.finish(Buffer.from('data: [DONE]\n\n'), 'end');
  });

  it('events written in one turn go in one batch', async () => {
    const id = 'chatcmpl-pipeline2';
    const lease = shared.open(id, '{}', '');
    lease.append(Buffer.from('id: 0\ndata: a\n\n'));
    lease.append(Buffer.from('id: 1\ndata: b\n\n'));
    const mark = lease.append(Buffer.from('id: 2\ndata: c\n\n'));
    await released(lease, mark!, 'the three events released');
    assert.deepEqual(await entries(id), ['id: 0\ndata: a\n\nid: 1\ndata: b\n\nid: 2\ndata: c\n\n']);
    await lease.finish(Buffer.from('data: [DONE]\n\n'), 'end');
  });

  it('the store has nothing of a stream until its first batch, and that one script opens it: fenced (its holder, its lease), its plan and tenant', async () => {
    const id = 'chatcmpl-pipeline3';
    const k = { meta: `ebb:{${id}}:meta`, lease: `ebb:{${id}}:lease` };
    const before = await scriptsRun(admin);
    const lease = shared.open(id, '{"gens":[{}]}', 'tenant-a');
    // A round trip on the lease's own connection: whatever open() sent is in before the look.
    await shared.store.client.ping();
    assert.equal(await admin.exists(k.meta, k.lease), 0, 'no key of the stream before its first batch');
    const mark = lease.append(Buffer.from('id: 0\ndata: a\n\n'));
    await released(lease, mark!, 'the first batch released');
    await lease.opened;
    const meta = await admin.hgetall(k.meta);
    assert.deepEqual({ state: meta.state, next: meta.next, plan: meta.plan, tenant: meta.tenant }, { state: 'live', next: '1', plan: '{"gens":[{}]}', tenant: 'tenant-a' });
    assert.ok(meta.holder !== undefined && meta.holder === (await admin.get(k.lease)), `the lease is held by the stream's fence token: ${meta.holder}`);
    assert.ok((await admin.pttl(k.meta)) > 0, "the stream's keys carry a TTL");
    assert.equal((await scriptsRun(admin)) - before, 1, 'one script opened the stream and copied its first batch');
    await lease.finish(Buffer.from('data: [DONE]\n\n'), 'end');
  });

  it("streams flushed in one turn go in one script, each fenced on its own: a stream another writer took is told so and copies nothing, the others' batches are copied", async () => {
    const ids = ['chatcmpl-pipeline5', 'chatcmpl-pipeline6', 'chatcmpl-pipeline7'];
    const leases = ids.map((id) => shared.open(id, '{}', 't'));
    const marks = leases.map((lease, i) => lease.append(Buffer.from(`id: 0\ndata: ${i}\n\n`))!);
    await Promise.all(leases.map((lease, i) => released(lease, marks[i]!, `stream ${i}'s first batch released`)));
    // Another frontend holds the second stream now (its fence token changed): its writer must learn it at its next batch.
    await admin.hset(`ebb:{${ids[1]}}:meta`, 'holder', 'another-frontend:token');
    await pastBatchSpacing();
    const before = await scriptsRun(admin);
    const next = leases.map((lease, i) => lease.append(Buffer.from(`id: 1\ndata: ${i}\n\n`)));
    const [first, lost, third] = await Promise.all([0, 1, 2].map((i) => released(leases[i]!, next[i]!, `stream ${i}'s second batch answered`)));
    assert.deepEqual([first, lost, third], [next[0], 'drop', next[2]], "the held batches of the streams still held go out; the taken stream's never does");
    assert.ok(leases[1]!.lost.aborted, 'its writer learnt it lost the stream');
    assert.equal((await scriptsRun(admin)) - before, 1, "one script carried the three streams' batches");
    for (const i of [0, 2]) assert.deepEqual(await entries(ids[i]!), [`id: 0\ndata: ${i}\n\n`, `id: 1\ndata: ${i}\n\n`], `stream ${i}'s copy`);
    assert.deepEqual(await entries(ids[1]!), ['id: 0\ndata: 1\n\n'], "the taken stream's copy has nothing from its old writer");
    for (const i of [0, 2]) await leases[i]!.finish(Buffer.from('data: [DONE]\n\n'), 'end');
  });

  it('a flush of more streams than one script takes goes as several: 130 streams in three scripts, every batch copied', async () => {
    const ids = Array.from({ length: 130 }, (_, i) => `chatcmpl-many${i}`);
    const leases = ids.map((id) => shared.open(id, '{}', 't'));
    const marks = leases.map((lease, i) => lease.append(Buffer.from(`id: 0\ndata: ${i}\n\n`))!);
    await Promise.all(leases.map((lease, i) => released(lease, marks[i]!, `stream ${i}'s first batch released`)));
    await pastBatchSpacing();
    const before = await scriptsRun(admin);
    const next = leases.map((lease, i) => lease.append(Buffer.from(`id: 1\ndata: ${i}\n\n`))!);
    await Promise.all(leases.map((lease, i) => released(lease, next[i]!, `stream ${i}'s second batch released`)));
    assert.equal((await scriptsRun(admin)) - before, 3, 'at most 64 streams a script: 64 + 64 + 2');
    for (const i of [0, 64, 129]) assert.deepEqual(await entries(ids[i]!), [`id: 0\ndata: ${i}\n\n`, `id: 1\ndata: ${i}\n\n`], `stream ${i}'s copy`);
    await Promise.all(leases.map((lease) => lease.finish(Buffer.from('data: [DONE]\n\n'), 'end')));
  });

  it('a stream that ends before its first batch went is opened, copied and ended by one script', async () => {
    const id = 'chatcmpl-pipeline4';
    const before = await scriptsRun(admin);
    const lease = shared.open(id, '{}', 'tenant-b');
    lease.append(Buffer.from('id: 0\ndata: a\n\n'));
    lease.append(Buffer.from('id: 1\ndata: b\n\n'));
    await lease.finish(Buffer.from('data: [DONE]\n\n'), 'end');
    await lease.opened;
    const entries = await admin.xrange(`ebb:{${id}}:events`, '-', '+');
    assert.deepEqual(entries.map(([, f]) => f.filter((_, i) => i % 2 === 0)), [['b', 'e', 'p', 'end']], 'one entry, the end');
    assert.equal(entries[0]![1][3], 'id: 0\ndata: a\n\nid: 1\ndata: b\n\ndata: [DONE]\n\n', 'it holds every event');
    assert.deepEqual(await admin.hmget(`ebb:{${id}}:meta`, 'state', 'tenant', 'next'), ['ended', 'tenant-b', '1']);
    assert.equal(await admin.exists(`ebb:{${id}}:lease`), 0, 'no lease left');
    assert.equal((await scriptsRun(admin)) - before, 1, 'one script: open, batch and end');
  });
});
