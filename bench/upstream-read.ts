/**
 * CPU per token of the frontend's upstream read path alone, in process: Upstream.open against one
 * mocker worker (a child process, ITL 0), every batch read to the end, at `--concurrency` streams.
 * `--upstream` times another build's upstream.js (e.g. a checkout from before a change), with its
 * own worker-pool.js and metrics.js beside it.
 *
 *   node dist/bench/upstream-read.js [--concurrency 64] [--duration-ms 3000] [--max-tokens 64] [--upstream path/to/upstream.js]
 */
import { setMaxListeners } from 'node:events';
import { dirname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { startWorker, tempDiscoveryUrl, killAllNow } from '../test/helpers/processes.js';
import { arg } from './cli-arg.js';

const concurrency = Number(arg('concurrency', '64'));
const durationMs = Number(arg('duration-ms', '3000'));
const maxTokens = Number(arg('max-tokens', '64'));
const builds = arg('upstream', new URL('../src/frontend/upstream.js', import.meta.url).pathname).split(',').map((p) => resolve(p));
process.on('exit', killAllNow);

const worker = await startWorker(['--model', 'm', '--discovery', tempDiscoveryUrl(), '--mocker-ttft-ms', '0', '--mocker-itl-ms', '0', '--mocker-batch-slots', '1024']);
const rows = [];
for (let round = 0; round < 3; round++) {
  for (const build of round % 2 === 0 ? builds : [...builds].reverse()) {
    const dir = dirname(build);
    const { Upstream } = await import(pathToFileURL(build).href);
    const { WorkerPool } = await import(pathToFileURL(join(dir, 'worker-pool.js')).href);
    const { createFrontendMetrics } = await import(pathToFileURL(join(dir, 'metrics.js')).href);
    const pool = new WorkerPool();
    pool.apply({ type: 'reset', records: [{ worker_id: worker.workerId, model: 'm', mode: 'aggregated', request_url: worker.requestUrl, system_url: worker.systemUrl }] });
    const upstream = new Upstream(pool, createFrontendMetrics(pool));
    const signal = new AbortController().signal;
    setMaxListeners(0, signal); // one signal for every stream here; a real request has its own
    let tokens = 0;
    const run = async (ms: number) => {
      const deadline = performance.now() + ms;
      await Promise.all(
        Array.from({ length: concurrency }, async () => {
          while (performance.now() < deadline) {
            const up = await upstream.open({ model: 'm', prompt: 'user: tell me about tides', max_tokens: maxTokens, stream: true }, 'aggregated', signal);
            let n = 0;
            for (let batch = up.first; batch; batch = (await up.rest.next()).value ?? undefined) {
              for (const l of batch) if ('text' in l) n++;
              if (batch.some((l: object) => 'done' in l)) break;
            }
            up.release();
            tokens += n;
          }
        }),
      );
    };
    await run(500);
    tokens = 0;
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    await run(durationMs);
    const c = process.cpuUsage(c0);
    const elapsed = performance.now() - t0;
    rows.push({ build, round, tokens, tok_per_s: Math.round((tokens / elapsed) * 1000), user_us_per_token: +(c.user / tokens).toFixed(2), sys_us_per_token: +(c.system / tokens).toFixed(2) });
    console.log(`${build}: ${Math.round((tokens / elapsed) * 1000)} tok/s, ${(c.user / tokens).toFixed(2)} µs user + ${(c.system / tokens).toFixed(2)} µs sys per token`);
    await upstream.close();
  }
}
console.log(JSON.stringify({ bench: 'upstream-read', concurrency, max_tokens: maxTokens, rows }));
await worker.stop();
