/**
 * A client that leaves stops the work it caused (issue 45 item 4): leaving during a disaggregated
 * prefill, a plain stream's prefill stops at once on the prefill worker and a kept stream's
 * (x-ebb-resumable: 1) once the resume grace is over; either way the prefill worker's in-flight
 * and pending KV transfers reach 0 and no transfer is made for nobody. On llama-cpp the prefill
 * stops within one batch of the context, not at the end of a long prompt.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { writeTinyLlamaGguf } from './helpers/gguf.js';
import { call } from './helpers/http.js';
import { bounded, metricValue, spawnEbb, startFrontend, startWorker, tempDiscoveryUrl, workerReady, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

/** What the prefill worker holds for requests: admitted ones, and KV transfers waiting for a decode peer. */
async function held(w: WorkerHandle): Promise<{ inflight: number; transfers: number }> {
  const status = (await call('GET', `${w.systemUrl}/engine/status`)).body;
  return { inflight: status.inflight_requests as number, transfers: status.engine.kv_transfers_pending as number };
}

/** Waits (bounded) until the worker holds what `pred` accepts; resolves with it. */
async function until(w: WorkerHandle, what: string, pred: (h: { inflight: number; transfers: number }) => boolean): Promise<{ inflight: number; transfers: number }> {
  return bounded(
    (async () => {
      for (;;) {
        const h = await held(w);
        if (pred(h)) return h;
        // The worker's status has no event to wait on for this: read again shortly.
        await sleep(25);
      }
    })(),
    `the prefill worker: ${what}`,
  );
}

/** A prompt of `n` words: `n` mocker tokens, about `n` for the tiny llama model. */
const promptOf = (n: number, word = 'tide') => Array.from({ length: n }, () => word).join(' ');

describe('a client that leaves during a disaggregated prefill', () => {
  /** Long enough to be under way when the client leaves: 2,000 prompt tokens at 200 a second (a word of its own per test: nothing cached). */
  const prompt = (word: string) => promptOf(2000, word);
  const GRACE_MS = 5000;
  let prefill: WorkerHandle;
  let frontend: FrontendHandle;
  before(async () => {
    const discovery = tempDiscoveryUrl();
    prefill = await startWorker(['--discovery', discovery, '--model', 'm1', '--mode', 'prefill', '--mocker-prefill-tokens-per-s', '200']);
    started.push(prefill);
    const decode = await startWorker(['--discovery', discovery, '--model', 'm1', '--mode', 'decode', '--mocker-itl-ms', '5']);
    started.push(decode);
    frontend = await startFrontend(discovery, ['--resume-grace-ms', String(GRACE_MS)]);
    started.push(frontend);
    await frontend.waitForLog((l) => l.event === 'discovery_reset' && (l.workers as string[]).length === 2, 'the frontend to see both workers');
  });

  /** Sends a streamed request and returns its abort, once the prefill worker is computing its prompt. */
  async function leaving(word: string, headers: Record<string, string>): Promise<() => void> {
    const client = new AbortController();
    const answer = fetch(`${frontend.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify({ model: 'm1', prompt: prompt(word), max_tokens: 5, stream: true }), signal: client.signal });
    answer.catch(() => undefined);
    await until(prefill, 'computing the prompt', (h) => h.inflight === 1);
    return () => client.abort();
  }

  it('a plain stream: the prefill stops at once; nothing is left in flight or pending', async (t) => {
    const leave = await leaving('plain', {});
    const left = performance.now();
    leave();
    await until(prefill, 'nothing in flight, no transfer pending', (h) => h.inflight === 0 && h.transfers === 0);
    t.diagnostic(`the prefill worker held nothing ${Math.round(performance.now() - left)} ms after the client left`);
    assert.equal(await metricValue(prefill.systemUrl, 'ebb_kv_transfer_duration_seconds_count'), 0, 'no KV transfer was made for nobody');
  });

  it('a kept stream (x-ebb-resumable: 1): the prefill goes on for the resume grace, then stops; nothing is left in flight or pending', async (t) => {
    const leave = await leaving('kept', { 'x-ebb-resumable': '1' });
    const left = performance.now();
    leave();
    const during = await held(prefill);
    const now = performance.now() - left;
    assert.ok(now >= GRACE_MS || during.inflight === 1, `within the grace (${Math.round(now)} ms of ${GRACE_MS}) the kept stream's prefill goes on: ${JSON.stringify(during)}`);
    await until(prefill, 'nothing in flight, no transfer pending', (h) => h.inflight === 0 && h.transfers === 0);
    t.diagnostic(`the prefill worker held nothing ${Math.round(performance.now() - left)} ms after the client left (resume grace ${GRACE_MS} ms)`);
    assert.equal(await metricValue(prefill.systemUrl, 'ebb_kv_transfer_duration_seconds_count'), 0, 'no KV transfer was made for nobody');
  });
});

describe('llama-cpp: a prefill whose caller leaves', () => {
  const modelPath = writeTinyLlamaGguf();
  /** About 7,000 tokens: a dozen batches of the context's 512, seconds of work on one CPU thread. */
  const PROMPT = promptOf(7000, 'a');
  let p: WorkerHandle;
  before(async () => {
    const proc = spawnEbb(['worker', '--port', '0', '--system-port', '0', '--discovery', tempDiscoveryUrl(), '--engine', 'llama-cpp', '--model-path', modelPath, '--model', 'tiny', '--mode', 'prefill', '--threads', '1', '--gpu', 'off', '--context-size', '8192', '--parallel', '1'], 'worker');
    started.push(proc);
    p = await workerReady(proc);
  });

  it('stops within a batch of the context instead of evaluating the rest of the prompt for nobody', async () => {
    const body = JSON.stringify({ model: 'tiny', prompt: PROMPT, max_tokens: 1 });
    const caller = new AbortController();
    const answer = fetch(`${p.requestUrl}/prefill`, { method: 'POST', headers: { 'content-type': 'application/json' }, body, signal: caller.signal });
    answer.catch(() => undefined);
    await until(p, 'evaluating the prompt', (h) => h.inflight === 1);
    caller.abort();
    await until(p, 'nothing in flight, no transfer pending', (h) => h.inflight === 0 && h.transfers === 0);
    // What the left prefill evaluated stays cached in its sequence: the same prompt again finds exactly that.
    const again = await call('POST', `${p.requestUrl}/prefill`, JSON.parse(body));
    assert.equal(again.status, 200, JSON.stringify(again.body));
    const total = again.body.prompt_tokens as number;
    const cached = again.body.cached_tokens as number;
    assert.ok(total > 6000, `the prompt is long: ${total} tokens`);
    assert.ok(cached < total - 1 - 512, `the left prefill stopped a batch or more before the prompt's end: ${cached} of ${total} tokens had been evaluated`);
    await call('DELETE', `${p.requestUrl}/kv/${again.body.transfer_id as string}`);
  });
});
