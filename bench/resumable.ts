/**
 * Resumable streams' cost (issues 32, 43): the frontend's CPU per streamed token with the stream
 * store off (`--stream-store none`), a plain stream with the default store (not kept: its client
 * did not ask), a kept stream (`x-ebb-resumable: 1`) in memory and one shared in Redis (a
 * redis-server started here, when one is installed), side by side in one run, and the latency of a
 * resume (GET .../{id}?stream=true&starting_after=N) to its first replayed byte.
 *
 *   npm run build && node dist/bench/resumable.js [--duration-ms 4000] [--rounds 3] [--concurrency 64] [--max-tokens 64] [--resumes 200]
 *
 * One mocker worker (itl 0, ttft 0) and one frontend per mode, as child processes on loopback;
 * closed-loop streaming load on each frontend in turn (rounds alternate), its CPU read from /proc.
 * Prints a table, then one JSON line.
 * It always stops by itself (a watchdog) and kills its children on any exit.
 */
import { rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { Agent, request } from 'undici';
import { killAllNow, startFrontend, startWorker, tempDiscoveryUrl, type FrontendHandle } from '../test/helpers/processes.js';
import { arg } from './cli-arg.js';
import { redisSkipReason, startRedis } from '../test/helpers/redis.js';
import { procCpuMs } from './proc-cpu.js';

const durationMs = Number(arg('duration-ms', '4000'));
const rounds = Number(arg('rounds', '3'));
const concurrency = Number(arg('concurrency', '64'));
const maxTokens = Number(arg('max-tokens', '64'));
const resumes = Number(arg('resumes', '200'));

const discovery = tempDiscoveryUrl();
process.on('exit', () => {
  killAllNow();
  rmSync(fileURLToPath(discovery), { recursive: true, force: true });
});
setTimeout(() => {
  console.error('bench: watchdog: taking too long, stopping');
  process.exit(2);
}, 15 * 60_000).unref();

const dispatcher = new Agent({ connections: concurrency * 2, keepAliveTimeout: 10_000 });
const body = JSON.stringify({ model: 'm1', messages: [{ role: 'user', content: 'tell me about tides' }], max_tokens: maxTokens, stream: true });

/** One streamed chat completion; resolves with its events counted (one per token, plus role, finish and [DONE]). */
const PLAIN = { 'content-type': 'application/json' };
const KEPT = { ...PLAIN, 'x-ebb-resumable': '1' };

async function oneStream(url: string, headers: Record<string, string>): Promise<number> {
  const res = await request(`${url}/v1/chat/completions`, { method: 'POST', dispatcher, headers, body });
  // Events end with a blank line; one may span two reads, so the text is scanned whole.
  let text = '';
  for await (const chunk of res.body as AsyncIterable<Buffer>) text += chunk.toString('latin1');
  return text.split('\n\n').length - 1;
}

/** Closed-loop load for durationMs: the frontend's CPU ms per 1,000 tokens. */
async function measure(frontend: FrontendHandle, headers: Record<string, string>): Promise<{ cpuMsPer1kTokens: number; tokensPerS: number }> {
  const deadline = Date.now() + durationMs;
  let tokens = 0;
  const cpu0 = procCpuMs(frontend.pid)!;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (Date.now() < deadline) {
        // Awaited first: `tokens += await ...` would read tokens before the wait and lose the other streams' counts.
        const events = await oneStream(frontend.url, headers);
        tokens += events - 3;
      }
    }),
  );
  const cpu = procCpuMs(frontend.pid)! - cpu0;
  const seconds = (performance.now() - t0) / 1000;
  return { cpuMsPer1kTokens: (cpu / tokens) * 1000, tokensPerS: tokens / seconds };
}

/** Time from a resume's request to its first replayed byte, for `resumes` streams cut after 10 events. */
async function resumeLatency(frontend: FrontendHandle): Promise<{ p50: number; p99: number }> {
  const samples: number[] = [];
  for (let i = 0; i < resumes; i++) {
    const res = await request(`${frontend.url}/v1/chat/completions`, { method: 'POST', dispatcher, headers: KEPT, body });
    let head = '';
    for await (const chunk of res.body as AsyncIterable<Buffer>) head += chunk.toString('utf8');
    const id = /"id":"(chatcmpl-[0-9a-f]+)"/.exec(head)![1]!;
    const t0 = performance.now();
    const again = await request(`${frontend.url}/v1/chat/completions/${id}?stream=true&starting_after=10`, { dispatcher });
    for await (const _ of again.body as AsyncIterable<Buffer>) {
      samples.push(performance.now() - t0);
      again.body.destroy();
      break;
    }
  }
  samples.sort((a, b) => a - b);
  const at = (q: number) => samples[Math.min(samples.length - 1, Math.floor(q * samples.length))]!;
  return { p50: at(0.5), p99: at(0.99) };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '0', '--mocker-ttft-ms', '0', '--mocker-batch-slots', '256']);
const redis = redisSkipReason() === undefined ? await startRedis() : undefined;
process.on('exit', () => void redis?.kill());
type Mode = 'off' | 'plain' | 'kept' | 'redis';
const memory = await startFrontend(discovery);
const frontends: Partial<Record<Mode, { f: FrontendHandle; headers: Record<string, string> }>> = {
  off: { f: await startFrontend(discovery, ['--stream-store', 'none']), headers: PLAIN },
  plain: { f: memory, headers: PLAIN },
  kept: { f: memory, headers: KEPT },
};
if (redis !== undefined) frontends.redis = { f: await startFrontend(discovery, ['--stream-store', redis.url]), headers: KEPT };
for (const { f, headers } of Object.values(frontends)) await oneStream(f.url, headers); // each sees the worker, and is warm
const order = Object.keys(frontends) as Mode[];
const samples: Partial<Record<Mode, number[]>> = Object.fromEntries(order.map((m) => [m, []]));
for (let r = 0; r < rounds; r++)
  // Each round in another order: no mode always runs first (or on a warmer machine).
  for (const mode of [...order.slice(r % order.length), ...order.slice(0, r % order.length)]) {
    const m = await measure(frontends[mode]!.f, frontends[mode]!.headers);
    samples[mode]!.push(m.cpuMsPer1kTokens);
    console.log(`round ${r + 1} ${mode.padEnd(6)} ${m.cpuMsPer1kTokens.toFixed(1)} CPU ms / 1,000 tokens (${Math.round(m.tokensPerS)} tokens/s)`);
  }
const latency = await resumeLatency(memory);
const cpu = Object.fromEntries(order.map((m) => [m, median(samples[m]!)])) as Partial<Record<Mode, number>>;
const over = (m: Mode) => (cpu[m] === undefined ? undefined : cpu[m]! / cpu.off!);
console.log(`\nmedian CPU per 1,000 tokens at ${concurrency} streams: ${order.map((m) => `${m} ${cpu[m]!.toFixed(1)} ms (x${over(m)!.toFixed(3)})`).join(', ')}${redis === undefined ? ' (no redis-server here: not measured)' : ''}`);
console.log(`resume to first replayed byte (memory): p50 ${latency.p50.toFixed(2)} ms, p99 ${latency.p99.toFixed(2)} ms (${resumes} resumes)`);
console.log(JSON.stringify({ concurrency, max_tokens: maxTokens, rounds, cpu_ms_per_1k_tokens: cpu, plain_over_off: over('plain'), kept_over_off: over('kept'), redis_over_off: over('redis'), resume_first_byte_ms: latency }));
process.exit(0);
