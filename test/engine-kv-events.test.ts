/**
 * `--engine openai --engine-kv-events`: a real worker subscribed to a KV event publisher written
 * here that speaks vLLM's documented format (ZMQ PUB, multipart [topic, seq, msgpack batch],
 * msgspec tagged-array events), translating the engine's blocks into ebb's hashes on GET /kv/events;
 * and POST /tokenize through the engine server (vLLM's and llama-server's shapes, a clear error
 * where the server has none).
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Packr } from 'msgpackr';
import { Router, XPublisher } from 'zeromq';
import { blockHashes, chainHash, ROOT_BLOCK_HASH } from '../src/protocol/block-hash.js';
import { call } from './helpers/http.js';
import { openEventStream, type EventStream } from './helpers/event-stream.js';
import { simTemplate, simTokenIds, startEngineSim, type EngineSim, type EngineSimOptions, type SimKind } from './helpers/engine-sim.js';
import { startWorker, tempDiscoveryUrl, type WorkerHandle } from './helpers/processes.js';

const BLOCK = 4;
const packr = new Packr({ useRecords: false });

/**
 * vLLM's publisher: an XPUB, so the test knows when the worker's subscription has arrived, and
 * optionally its replay ROUTER serving the batches it keeps (seq >= the asked start, then seq -1).
 */
class FakeVllmPublisher {
  private seq = 0n;
  private readonly kept: Array<[bigint, Buffer]> = [];
  replayEndpoint = '';
  private replaySock: Router | undefined;
  private constructor(
    private readonly sock: XPublisher,
    readonly endpoint: string,
  ) {}

  static async bind(endpoint = 'tcp://127.0.0.1:*', replay = false): Promise<FakeVllmPublisher> {
    const sock = new XPublisher();
    // A restarted engine rebinds its old port, which ZMQ's I/O thread frees a moment after unbind
    // (no event says when): retried, bounded.
    for (let attempt = 1; ; attempt++) {
      try {
        await sock.bind(endpoint);
        break;
      } catch (err) {
        if (attempt >= 100 || !/in use/i.test((err as Error).message)) throw err;
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    }
    const pub = new FakeVllmPublisher(sock, sock.lastEndpoint as string);
    if (replay) await pub.serveReplay();
    return pub;
  }

  private async serveReplay(): Promise<void> {
    const router = new Router();
    await router.bind('tcp://127.0.0.1:*');
    this.replaySock = router;
    this.replayEndpoint = router.lastEndpoint as string;
    void (async () => {
      try {
        for await (const [id, , start] of router) {
          const from = (start as Buffer).readBigInt64BE(0);
          for (const [seq, payload] of this.kept) if (seq >= from) await router.send([id as Buffer, Buffer.alloc(0), be8(seq), payload]);
          await router.send([id as Buffer, Buffer.alloc(0), be8(-1n), Buffer.alloc(0)]);
        }
      } catch {
        /* closed */
      }
    })();
  }

  /** Resolves when a subscriber subscribes (XPUB hands the subscription frame up). */
  async subscribed(): Promise<void> {
    const [msg] = await this.sock.receive();
    assert.equal(msg?.[0], 1, 'a subscribe frame');
  }

  /**
   * One batch as vLLM's ZmqEventPublisher sends it: [topic, seq as 8 bytes big-endian, EventBatch],
   * kept for replay. `lost`: kept but never delivered (a subscriber that fell behind).
   */
  async send(events: unknown[], seq = this.seq, lost = false): Promise<void> {
    this.seq = seq + 1n;
    const payload = packr.pack([Date.now() / 1000, events, 0]);
    this.kept.push([seq, payload]);
    if (!lost) await this.sock.send([Buffer.from(''), be8(seq), payload]);
  }

  /** Resolves once the endpoint is free again (closing alone lets it go later, in ZMQ's I/O thread). */
  async close(): Promise<void> {
    if (this.sock.closed) return;
    await this.sock.unbind(this.endpoint);
    this.sock.close();
    this.replaySock?.close();
  }
}

function be8(n: bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigInt64BE(n);
  return b;
}

const stored = (hashes: unknown[], parent: unknown, tokens: number[], blockSize = BLOCK) => ['BlockStored', hashes, parent, tokens, blockSize, null, 'GPU'];
const removed = (hashes: unknown[]) => ['BlockRemoved', hashes, 'GPU'];

const sims: EngineSim[] = [];
const workers: WorkerHandle[] = [];
after(async () => {
  await Promise.all(workers.map((w) => w.stop()));
  await Promise.all(sims.map((s) => s.close()));
});

async function fronted(kind: SimKind, args: string[] = [], simOpts: Partial<EngineSimOptions> = {}): Promise<WorkerHandle & { discoveryDir: string; sim: EngineSim }> {
  const sim = await startEngineSim({ kind, itlMs: 1, ...simOpts });
  sims.push(sim);
  const url = tempDiscoveryUrl();
  const w = await startWorker(['--discovery', url, '--model', 'm1', '--engine', 'openai', '--engine-kind', kind, '--engine-url', sim.url, ...args]);
  workers.push(w);
  return Object.assign(w, { discoveryDir: fileURLToPath(url), sim });
}

const recordOf = (w: WorkerHandle & { discoveryDir: string }) => JSON.parse(readFileSync(join(w.discoveryDir, `${w.workerId}.json`), 'utf8')).record;

describe('--engine-kv-events: vLLM KV event batches over ZMQ into GET /kv/events', () => {
  let pub: FakeVllmPublisher;
  let w: WorkerHandle & { discoveryDir: string };
  let stream: EventStream;
  const kv = (after: number) => (pred: (e: any) => boolean, what: string) => stream.waitFor((e) => e.event === 'kv' && e.data.events.some(pred), what, after);

  before(async () => {
    pub = await FakeVllmPublisher.bind(undefined, true);
    const subscribed = pub.subscribed();
    w = await fronted('vllm', ['--engine-kv-events', pub.endpoint, '--engine-kv-events-replay', pub.replayEndpoint, '--engine-kv-block-size', String(BLOCK)]);
    await subscribed;
    stream = await openEventStream(`${w.systemUrl}/kv/events`);
    await stream.waitFor((e) => e.event === 'snapshot', 'the snapshot');
  });
  after(async () => {
    stream?.close();
    await pub?.close();
  });

  it('declares the engine\'s block size, tokenized by the worker, with exact events', () => {
    assert.deepEqual(recordOf(w).kv_cache, { block_size: BLOCK, tokenizer: 'worker', events: 'exact' });
  });

  it('translates stored blocks into ebb\'s hash chain from their token ids (int, 64-bit and bytes engine hashes)', async () => {
    const tokens = [11, 12, 13, 14, 21, 22, 23, 24, 31, 32, 33, 34];
    const ebb = blockHashes(tokens, BLOCK);
    const big = 2n ** 63n + 5n; // vLLM's hashes are 64-bit: beyond what a double holds exactly
    const bytes = Buffer.from('a1b2c3d4e5f60718293a4b5c6d7e8f90', 'hex');
    const at = stream.events.length;
    await pub.send([stored([101, big], null, tokens.slice(0, 8))]);
    const first = await kv(at)((e) => e.type === 'stored', 'the first stored event');
    assert.deepEqual(first.data.events, [{ type: 'stored', block_hashes: ebb.slice(0, 2), parent_block_hash: ROOT_BLOCK_HASH }]);
    // The chain goes on from an engine parent named by its 64-bit hash.
    const at2 = stream.events.length;
    await pub.send([stored([bytes], big, tokens.slice(8))]);
    const second = await kv(at2)((e) => e.type === 'stored', 'the chained stored event');
    assert.deepEqual(second.data.events, [{ type: 'stored', block_hashes: [ebb[2]], parent_block_hash: ebb[1] }]);
    // Removal by the engine's hash (bytes) names ebb's.
    const at3 = stream.events.length;
    await pub.send([removed([bytes])]);
    const third = await kv(at3)((e) => e.type === 'removed', 'the removed event');
    assert.deepEqual(third.data.events, [{ type: 'removed', block_hashes: [ebb[2]] }]);
    const snap = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(snap.body.engine.kv_events.engine_blocks, 2);
  });

  it('skips what it cannot name: another block size, an unknown parent, a LoRA (never a wrong hash)', async () => {
    const at = stream.events.length;
    await pub.send([
      stored([501], null, [1, 2, 3, 4, 5, 6, 7, 8], 8),
      stored([502], 999_999, [1, 2, 3, 4]),
      ['BlockStored', [503], null, [5, 5, 5, 5], BLOCK, 7, 'GPU'],
      stored([504], null, [9, 9, 9, 9]),
    ]);
    const e = await kv(at)((x) => x.type === 'stored', 'the one nameable block');
    assert.deepEqual(e.data.events, [{ type: 'stored', block_hashes: [chainHash(ROOT_BLOCK_HASH, [9, 9, 9, 9])], parent_block_hash: ROOT_BLOCK_HASH }]);
    const status = await call('GET', `${w.systemUrl}/engine/status`);
    assert.deepEqual(status.body.engine.kv_events.skipped, { block_size: 1, unknown_parent: 1, lora: 1 });
  });

  it('a sequence gap the replay cannot fill (its buffer lacks the lost batches) publishes cleared, then goes on from the batches that follow', async () => {
    const at = stream.events.length;
    const skipped = (status: any) => status.body.engine.kv_events.gaps as number;
    const gapsBefore = skipped(await call('GET', `${w.systemUrl}/engine/status`));
    await pub.send([stored([601], null, [6, 6, 6, 6])], 100n);
    const cleared = await kv(at)((e) => e.type === 'cleared', 'cleared after the gap');
    assert.deepEqual(cleared.data.events.map((e: any) => e.type), ['cleared', 'stored'], 'what was known is dropped first, then the new batch applies');
    assert.equal(skipped(await call('GET', `${w.systemUrl}/engine/status`)), gapsBefore + 1);
    const fresh = await openEventStream(`${w.systemUrl}/kv/events`);
    try {
      const snap = await fresh.waitFor((e) => e.event === 'snapshot', 'a new snapshot');
      assert.deepEqual(snap.data.blocks, [chainHash(ROOT_BLOCK_HASH, [6, 6, 6, 6])]);
    } finally {
      fresh.close();
    }
  });

  it('a gap the replay fills: the lost batch is asked for and applied in order, nothing is cleared', async () => {
    const at = stream.events.length;
    const [a, b] = [[8, 8, 8, 8], [9, 9, 9, 9]];
    await pub.send([stored([801], 601, a)], 101n, true);
    await pub.send([stored([802], 801, b)], 102n);
    const hA = chainHash(chainHash(ROOT_BLOCK_HASH, [6, 6, 6, 6]), a);
    const e = await kv(at)((x) => x.type === 'stored' && x.block_hashes.includes(chainHash(hA, b)), 'the batch after the lost one');
    const seen = stream.events.slice(at).flatMap((x) => (x.event === 'kv' ? x.data.events : []));
    assert.deepEqual(seen, [
      { type: 'stored', block_hashes: [hA, chainHash(hA, b)], parent_block_hash: chainHash(ROOT_BLOCK_HASH, [6, 6, 6, 6]) },
    ], `the lost block first, chained, no cleared (${JSON.stringify(e.data)})`);
    const status = await call('GET', `${w.systemUrl}/engine/status`);
    assert.equal(status.body.engine.kv_events.replayed, 1);
  });

  it('AllBlocksCleared clears; a publisher that restarts (seq from 0 again, on a reconnect) clears too', async () => {
    const at = stream.events.length;
    await pub.send([['AllBlocksCleared']]);
    await kv(at)((e) => e.type === 'cleared', 'cleared');
    // The engine restarts: its socket goes, a new one binds the same endpoint, numbering from 0.
    await pub.close();
    pub = await FakeVllmPublisher.bind(w.logs.find((l) => l.event === 'engine_kv_events_connected')?.endpoint as string);
    await pub.subscribed();
    await w.waitForEvent('engine_kv_events_disconnected');
    const at2 = stream.events.length;
    await pub.send([stored([701], null, [7, 7, 7, 7])], 0n);
    const e = await kv(at2)((x) => x.type === 'stored', 'the restarted engine\'s block');
    assert.deepEqual(e.data.events.map((x: any) => x.type), ['cleared', 'stored']);
  });
});

describe('POST /tokenize through the engine server', () => {
  it('vLLM: the server\'s token ids for a prompt and for a chat (its template), continuation included; 404 for another model', async () => {
    const w = await fronted('vllm', [], { cachedTokens: 3 });
    assert.deepEqual(recordOf(w).kv_cache, { block_size: 16, tokenizer: 'worker', events: 'none' }, 'no events: the frontend approximates with these tokens');
    const plain = await call('POST', `${w.requestUrl}/tokenize`, { model: 'm1', prompt: 'the tide comes in' });
    assert.equal(plain.status, 200);
    assert.deepEqual(plain.body, { token_ids: simTokenIds('the tide comes in') });
    const messages = [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hello there' }];
    const chat = await call('POST', `${w.requestUrl}/tokenize`, { model: 'm1', messages });
    assert.deepEqual(chat.body.token_ids, simTokenIds(simTemplate(messages)));
    assert.deepEqual(w.sim.seen.at(-1)?.body, { model: 'sim-model', messages, add_generation_prompt: true });
    const cont = await call('POST', `${w.requestUrl}/tokenize`, { model: 'm1', prompt: 'the tide', continuation: { text: ' comes in', completion_tokens: 2 } });
    assert.deepEqual(cont.body.token_ids, simTokenIds('the tide comes in'));
    const ids = await call('POST', `${w.requestUrl}/tokenize`, { model: 'm1', prompt_token_ids: [5, 6, 7] });
    assert.deepEqual(ids.body.token_ids, [5, 6, 7]);
    const other = await call('POST', `${w.requestUrl}/tokenize`, { model: 'nope', prompt: 'x' });
    assert.equal(other.status, 404);
    assert.equal(other.body.error.code, 'model_not_found');
    // What the engine's prefix cache held comes back in the usage (vLLM's prompt_tokens_details).
    const gen = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'the tide comes in now', max_tokens: 2, stream: false });
    assert.equal(gen.status, 200);
    assert.deepEqual(gen.body.usage.prompt_tokens_details, { cached_tokens: 3 });
  });

  it('llama-server: /apply-template renders the chat, /tokenize its text', async () => {
    const w = await fronted('llamacpp');
    const messages = [{ role: 'user', content: 'hello there' }];
    const chat = await call('POST', `${w.requestUrl}/tokenize`, { model: 'm1', messages });
    assert.equal(chat.status, 200);
    assert.deepEqual(chat.body.token_ids, simTokenIds(simTemplate(messages)));
    assert.deepEqual(w.sim.seen.at(-1)?.body, { content: simTemplate(messages), add_special: true, parse_special: true });
  });

  it('a server without /tokenize: a clear 404, and no kv_cache declared', async () => {
    const w = await fronted('generic');
    assert.equal(recordOf(w).kv_cache, undefined);
    const gen = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'a b c', max_tokens: 2, stream: false });
    assert.equal(gen.body.usage.prompt_tokens_details, undefined, 'an engine that does not say reports nothing, not 0');
    const res = await call('POST', `${w.requestUrl}/tokenize`, { model: 'm1', prompt: 'x' });
    assert.equal(res.status, 404);
    assert.equal(res.body.error.code, 'not_found');
    assert.match(res.body.error.message, /has no POST \/tokenize/);
  });
});
