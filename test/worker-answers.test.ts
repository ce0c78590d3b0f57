/**
 * What the frontend does with each worker answer (src/protocol/worker-answers.ts): the table
 * covers the whole catalogue, an engine's refusal of the request reaches the client once with its
 * status and reason (streamed or not), and a worker that rejects the request-plane token is the
 * fleet's fault, never the client's 403.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ERROR_CODES, type ErrorCode } from '../src/protocol/errors.js';
import { WORKER_ANSWERS } from '../src/protocol/worker-answers.js';
import { startEngineSim, type EngineSim } from './helpers/engine-sim.js';
import { call } from './helpers/http.js';
import { startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { streamCompletion } from './helpers/sse.js';

describe('worker answers: the table', () => {
  it('has one row for every code of the catalogue, and passes only client errors to the client', () => {
    const codes = Object.keys(ERROR_CODES) as ErrorCode[];
    assert.deepEqual(Object.keys(WORKER_ANSWERS).sort(), [...codes].sort());
    for (const code of codes) {
      const row = WORKER_ANSWERS[code];
      assert.ok(['retry_elsewhere', 'pass_to_client', 'bad_gateway'].includes(row.action), `${code}: ${row.action}`);
      const status = ERROR_CODES[code].status;
      if (row.action === 'pass_to_client') assert.ok(status >= 400 && status < 500, `${code} (${status}) is passed to the client`);
      if (status >= 500) assert.notEqual(row.action, 'pass_to_client', `${code} is a server-side failure`);
    }
    // The rows the issue found wrong: a refusal about the request is the client's; a token rejection is not.
    assert.equal(WORKER_ANSWERS.invalid_request.action, 'pass_to_client');
    assert.equal(WORKER_ANSWERS.context_length_exceeded.action, 'pass_to_client');
    assert.equal(WORKER_ANSWERS.forbidden.action, 'retry_elsewhere');
    assert.equal(WORKER_ANSWERS.unauthorized.action, 'retry_elsewhere');
  });
});

const started: EbbProcess[] = [];
let sim: EngineSim | undefined;
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
  await sim?.close();
});

function tokenFile(token: string): string {
  const path = join(mkdtempSync(join(tmpdir(), 'ebb-test-token-')), 'token');
  writeFileSync(path, `${token}\n`, { mode: 0o600 });
  return path;
}

/** Upstream attempts per worker, by outcome, from the frontend's routing record. */
async function attempts(fe: FrontendHandle, workerIds: string[]): Promise<Record<string, number>> {
  const text = await fetch(`${fe.url}/metrics`).then((r) => r.text());
  const out: Record<string, number> = {};
  for (const m of text.matchAll(/^ebb_frontend_upstream_attempts_total\{worker_id="([^"]+)",outcome="([^"]+)"\} (\d+)/gm)) {
    if (workerIds.includes(m[1]!)) out[m[2]!] = (out[m[2]!] ?? 0) + Number(m[3]);
  }
  return out;
}

const LONG_PROMPT = Array.from({ length: 40 }, () => 'tide').join(' ');

describe('worker answers: one fleet', () => {
  const TOKEN = 'rp-good';
  let fe: FrontendHandle;
  /** m1: two workers whose engine's context (20 tokens) a 40-word prompt does not fit. */
  const m1: WorkerHandle[] = [];
  /** m2: one worker on a stale request-plane token, one on the fleet's. m3: only the stale one. */
  let stale2: WorkerHandle;
  let good2: WorkerHandle;
  let stale3: WorkerHandle;
  let simWorker: WorkerHandle;

  before(async () => {
    const discovery = tempDiscoveryUrl();
    const good = tokenFile(TOKEN);
    const stale = tokenFile('rp-old');
    const worker = async (model: string, token: string, args: string[] = []) => {
      const w = await startWorker(['--discovery', discovery, '--model', model, '--request-token-file', token, ...args]);
      started.push(w);
      return w;
    };
    sim = await startEngineSim({ kind: 'vllm', itlMs: 5, maxModelLen: 100, model: 'sim' });
    // One at a time: six processes starting together on a loaded machine miss the start bound.
    m1.push(await worker('m1', good, ['--mocker-max-context', '20']), await worker('m1', good, ['--mocker-max-context', '20']));
    stale2 = await worker('m2', stale);
    good2 = await worker('m2', good);
    stale3 = await worker('m3', stale);
    simWorker = await worker('sim', good, ['--engine', 'openai', '--engine-url', sim.url, '--engine-kind', 'vllm']);
    fe = await startFrontend(discovery, ['--request-token-file', good]);
    started.push(fe);
    for (const w of [...m1, stale2, good2, stale3, simWorker]) {
      const id = w.workerId;
      await fe.waitForLog((l) => (l.event === 'worker_added' && l.worker_id === id) || (l.event === 'discovery_reset' && (l.workers as string[]).includes(id)), `frontend sees ${id}`);
    }
  });

  it("a prompt over the mocker's context: 400 context_length_exceeded after one attempt, streamed or not", async () => {
    const ids = m1.map((w) => w.workerId);
    const before = await attempts(fe, ids);
    const whole = await call('POST', `${fe.url}/v1/completions`, { model: 'm1', prompt: LONG_PROMPT, max_tokens: 4 });
    assert.equal(whole.status, 400, JSON.stringify(whole.body));
    assert.equal(whole.body.error.code, 'context_length_exceeded');
    assert.match(whole.body.error.message, /context holds 20/);
    assert.equal(whole.body.error.retryable, undefined);
    const streamed = await streamCompletion(fe.url, { model: 'm1', messages: [{ role: 'user', content: LONG_PROMPT }], max_tokens: 4 });
    assert.equal(streamed.status, 400, streamed.error);
    assert.equal(JSON.parse(streamed.error!).error.code, 'context_length_exceeded');
    const after = await attempts(fe, ids);
    // Two requests, two attempts in all: neither was tried on the other worker.
    assert.deepEqual(after, { ...before, client_error: (before.client_error ?? 0) + 2 });
    // A prompt that fits is served as before.
    const ok = await call('POST', `${fe.url}/v1/completions`, { model: 'm1', prompt: 'tell me', max_tokens: 3 });
    assert.equal(ok.status, 200, JSON.stringify(ok.body));
  });

  it("vLLM's 400 (prompt + max_tokens over max_model_len): the client gets it once, with vLLM's reason", async () => {
    const before = await attempts(fe, [simWorker.workerId]);
    const whole = await call('POST', `${fe.url}/v1/completions`, { model: 'sim', prompt: 'tell me about tides', max_tokens: 200 });
    assert.equal(whole.status, 400, JSON.stringify(whole.body));
    assert.equal(whole.body.error.code, 'context_length_exceeded');
    assert.match(whole.body.error.message, /maximum context length is 100 tokens/);
    const streamed = await streamCompletion(fe.url, { model: 'sim', max_tokens: 200 });
    assert.equal(streamed.status, 400, streamed.error);
    assert.match(JSON.parse(streamed.error!).error.message, /maximum context length is 100 tokens/);
    const after = await attempts(fe, [simWorker.workerId]);
    assert.deepEqual(after, { ...before, client_error: (before.client_error ?? 0) + 2 });
  });

  it('a worker on a stale request-plane token: the request is served by another worker, never a 403', async () => {
    for (let i = 0; i < 4; i++) {
      const res = await call('POST', `${fe.url}/v1/completions`, { model: 'm2', prompt: 'tell me', max_tokens: 2 });
      assert.equal(res.status, 200, JSON.stringify(res.body));
    }
    const streamed = await streamCompletion(fe.url, { model: 'm2', max_tokens: 2 });
    assert.equal(streamed.status, 200, streamed.error);
    assert.equal(streamed.workerId, good2.workerId);
    // Not tried for every request: its rejection holds it out of routing for a while.
    const stale = await attempts(fe, [stale2.workerId]);
    assert.ok((stale.forbidden ?? 0) < 5, JSON.stringify(stale));
  });

  it('only workers on a stale token: a retryable 503 naming the rejection, not the 403', async () => {
    const res = await call('POST', `${fe.url}/v1/completions`, { model: 'm3', prompt: 'tell me', max_tokens: 2 });
    assert.equal(res.status, 503, JSON.stringify(res.body));
    assert.equal(res.body.error.code, 'no_serving_worker');
    assert.match(res.body.error.message, /request-plane token is not valid/);
    assert.equal((await attempts(fe, [stale3.workerId])).forbidden, 1);
  });
});
