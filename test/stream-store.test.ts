import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { EbbError } from '../src/protocol/errors.js';
import { StreamStore, STREAM_STORE_DEFAULTS, type StreamStoreOptions } from '../src/frontend/streams/stream-store.js';

/** An SSE event of about `size` bytes with id `id`, as a kept stream holds it. */
const event = (id: number, size: number) => Buffer.from(`id: ${id}\ndata: ${'x'.repeat(size)}\n\n`);

function store(opts: Partial<StreamStoreOptions>): StreamStore {
  return new StreamStore({ ...STREAM_STORE_DEFAULTS, ...opts });
}

const codeOf = (fn: () => unknown) => {
  try {
    fn();
    return 'kept';
  } catch (err) {
    return err instanceof EbbError ? err.code : String(err);
  }
};

describe('stream store bounds', () => {
  it('10,000 kept responses stay within the byte budget: the oldest ended ones are forgotten (response_expired), the newest kept', () => {
    const s = store({ maxTotalBytes: 4 << 20, maxStreams: 10_000 });
    for (let i = 0; i < 10_000; i++) {
      const k = s.open(`chatcmpl-${i}`, '', () => '');
      k.append(event(0, 1000));
      k.end(event(1, 10));
      assert.ok(s.keptBytes <= 4 << 20, `within the budget after ${i + 1}: ${s.keptBytes}`);
    }
    assert.equal(codeOf(() => s.get('chatcmpl-0', '')), 'response_expired');
    assert.equal(codeOf(() => s.get('chatcmpl-9999', '')), 'kept');
    assert.equal(codeOf(() => s.get('chatcmpl-never', '')), 'response_not_found');
    s.close();
  });

  it('at most maxStreams kept: past it the oldest ended goes; a live stream is never forgotten', () => {
    const s = store({ maxStreams: 3 });
    const live = s.open('resp_live', '', () => '');
    live.append(event(0, 10));
    for (let i = 0; i < 5; i++) s.open(`resp_${i}`, '', () => '').end(event(0, 10));
    assert.equal(s.size, 3);
    assert.equal(codeOf(() => s.get('resp_live', '')), 'kept');
    assert.equal(codeOf(() => s.get('resp_0', '')), 'response_expired');
    assert.equal(codeOf(() => s.get('resp_4', '')), 'kept');
    s.close();
  });

  it('one stream past its own bound is served, not kept: a resume is refused', () => {
    const s = store({ maxResponseBytes: 1000 });
    const k = s.open('chatcmpl-big', '', () => '');
    k.append(event(0, 600));
    assert.equal(codeOf(() => s.get('chatcmpl-big', '')), 'kept');
    k.append(event(1, 600));
    assert.equal(s.keptBytes, 0, 'its bytes are let go');
    assert.equal(codeOf(() => s.get('chatcmpl-big', '')), 'response_expired');
    s.close();
  });

  it('an ended stream is forgotten once its window has passed', () => {
    const s = store({ windowMs: 0 });
    s.open('cmpl-1', '', () => '').end(event(0, 10));
    assert.equal(codeOf(() => s.get('cmpl-1', '')), 'response_expired');
    assert.equal(s.size, 0);
    s.close();
  });

  it("an ended stream holds its bytes and nothing of its generation's: 5,000 kept for the window take under 1 KB of heap each", () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    const n = 5_000;
    const s = store({ maxStreams: n + 1 });
    gc();
    const before = process.memoryUsage().heapUsed;
    for (let i = 0; i < n; i++) {
      const k = s.open(`chatcmpl-${i}`, 'tenant', () => '');
      // As a request does: its signal watched, the generation's signal followed by the relay.
      k.watch(new AbortController().signal);
      k.signal.addEventListener('abort', () => undefined, { once: true });
      for (let e = 0; e < 16; e++) k.append(event(e, 100));
      k.end(Buffer.from('data: [DONE]\n\n'));
    }
    gc();
    const perStream = (process.memoryUsage().heapUsed - before) / n;
    assert.equal(s.size, n, 'every stream is still kept (resumable)');
    assert.equal(codeOf(() => s.get('chatcmpl-0', 'tenant')), 'kept');
    // What each held before: its signal and listeners, its followers' map, the store's hooks, its promises (about 2.3 KB).
    assert.ok(perStream < 1024, `an ended stream takes ${perStream.toFixed(0)} bytes of heap besides its bytes`);
    s.close();
  });
});
