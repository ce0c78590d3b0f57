/**
 * One request may fan out to prompts x n sequences, each holding a socket to a worker. The frontend
 * bounds them per request (400) and, across requests, by its file-descriptor limit (503, retryable)
 * instead of running into EMFILE: a real frontend under `ulimit -n 256`.
 */
import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { call, openLineStream, type JsonResponse, type OpenStream } from './helpers/http.js';
import { bounded, CLI, EbbProcess, startWorker, tempDiscoveryUrl } from './helpers/processes.js';

const FD_LIMIT = 256;
const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

const prompts = (k: number) => Array.from({ length: k }, (_, i) => `prompt ${i}`);

/** A client that honours Retry-After on a 503, as the SDKs do. */
async function withRetries(send: () => Promise<JsonResponse>, tries = 5): Promise<JsonResponse> {
  for (let i = 1; ; i++) {
    const res = await send();
    if (res.status !== 503 || i === tries) return res;
    await new Promise((r) => setTimeout(r, Number(res.headers.get('retry-after') ?? 1) * 1000));
  }
}

describe('frontend: sequences per request and the fd budget', { skip: process.platform === 'win32' ? 'needs bash and ulimit' : undefined }, () => {
  it('400 past --max-lanes-per-request, 503 frontend_overloaded past the fd budget, served again once streams end', async () => {
    const discovery = tempDiscoveryUrl();
    started.push(await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '50', '--mocker-batch-slots', '128']));
    // A client that leaves frees its sequences at once: no resume grace (--resume-grace-ms 0).
    const args = [CLI, 'frontend', '--port', '0', '--discovery', discovery, '--max-lanes-per-request', '24', '--resume-grace-ms', '0'];
    const proc = spawn('bash', ['-c', `ulimit -n ${FD_LIMIT}; exec "$0" "$@"`, process.execPath, ...args], { env: { ...process.env, EBB_LOG_LEVEL: 'info' }, stdio: ['ignore', 'pipe', 'pipe'] });
    const frontend = new EbbProcess(proc, `frontend (ulimit -n ${FD_LIMIT})`);
    started.push(frontend);
    const url = (await frontend.waitForEvent('frontend_ready')).url as string;
    const limits = await frontend.waitForEvent('frontend_limits');
    // 256 less the reserve (128) and the admin listener's 64 connections.
    assert.deepEqual([limits.fd_limit, limits.fd_budget, limits.max_lanes_per_request], [FD_LIMIT, 64, 24]);

    const tooMany = await call('POST', `${url}/v1/completions`, { model: 'm1', prompt: prompts(5), n: 5, max_tokens: 2 });
    assert.equal(tooMany.status, 400, JSON.stringify(tooMany.body));
    assert.equal(tooMany.body.error.code, 'invalid_request');
    assert.equal(tooMany.body.error.param, 'n');
    assert.match(tooMany.body.error.message, /25 sequences \(5 prompts x n=5\).*at most 24 per request \(--max-lanes-per-request\)/);

    // 16 + 24 sequences open, plus their two connections: 42 of 64 descriptors.
    const open: OpenStream[] = [];
    for (const body of [{ prompt: 'a', n: 16 }, { prompt: prompts(3), n: 8 }]) {
      const s = await openLineStream(`${url}/v1/completions`, { model: 'm1', stream: true, max_tokens: 100_000, ...body }, '\n\n');
      assert.equal(s.status, 200);
      await bounded(s.first, 'the stream started');
      open.push(s);
    }
    const refused = await call('POST', `${url}/v1/completions`, { model: 'm1', prompt: prompts(3), n: 8, max_tokens: 2 });
    assert.equal(refused.status, 503, JSON.stringify(refused.body));
    assert.equal(refused.body.error.code, 'frontend_overloaded');
    assert.equal(refused.body.error.retryable, true);
    assert.equal(refused.headers.get('retry-after'), null, 'no guess: when streams end is not known');
    assert.match(refused.body.error.message, /file-descriptor budget .* of 64/);
    assert.equal(proc.exitCode, null, 'the frontend is alive');

    for (const s of open) s.abort();
    const served = await withRetries(() => call('POST', `${url}/v1/completions`, { model: 'm1', prompt: prompts(3), n: 8, max_tokens: 2 }));
    assert.equal(served.status, 200, JSON.stringify(served.body));
    assert.equal(served.body.choices.length, 24);
  });
});
