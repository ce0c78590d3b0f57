/**
 * @ebb/client's cost and its seam (issue 43): the client CPU per streamed event that resumableFetch
 * adds to the openai SDK reading a long chat stream (its SSE framing and the spliced body), and the
 * longest pause between two chunks the SDK's loop sees when the stream is cut and resumed (the issue
 * wants it under 1 s), against the tests' local server (test/helpers/cutting-sse-server.ts) on loopback.
 *
 *   npm run build && node dist/bench/client-splice.js [--tokens 20000] [--rounds 6] [--cuts 50]
 *
 * Rounds alternate plain and resumableFetch; the CPU is this process's (the server's share is the same
 * in both). Prints a table, then one JSON line.
 */
import OpenAI from 'openai';
import { resumableFetch } from '@ebb/client';
import { startCuttingServer, type Cut } from '../test/helpers/cutting-sse-server.js';
import { arg } from './cli-arg.js';
import { percentile } from './percentile.js';

const tokens = Number(arg('tokens', '20000'));
const rounds = Number(arg('rounds', '6'));
const cuts = Number(arg('cuts', '50'));

const server = await startCuttingServer();
const plain = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0 });
const resumable = new OpenAI({ baseURL: server.baseURL, apiKey: 'unused', maxRetries: 0, fetch: resumableFetch() });

/** Reads one chat stream; its events, this process's CPU and the longest pause between two chunks. */
async function read(client: OpenAI, maxTokens: number) {
  const cpu = process.cpuUsage();
  let events = 0;
  let last = performance.now();
  let longest = 0;
  for await (const chunk of await client.chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'hi' }], stream: true, max_tokens: maxTokens })) {
    const now = performance.now();
    if (events > 0) longest = Math.max(longest, now - last);
    last = now;
    events += chunk.choices.length > 0 ? 1 : 0;
  }
  const used = process.cpuUsage(cpu);
  return { events, cpuUs: used.user + used.system, longestMs: longest };
}

const cpuPerEvent: Record<'plain' | 'resumable', number[]> = { plain: [], resumable: [] };
server.plan = {};
await read(plain, 1000);
await read(resumable, 1000);
for (let r = 0; r < rounds; r++) {
  for (const mode of r % 2 === 0 ? (['plain', 'resumable'] as const) : (['resumable', 'plain'] as const)) {
    const { events, cpuUs } = await read(mode === 'plain' ? plain : resumable, tokens);
    cpuPerEvent[mode].push(cpuUs / events);
  }
}

// The seam: a 200-token stream cut in its middle, each way, `cuts` times; the SDK's longest pause between chunks.
const seams: Record<string, number[]> = {};
for (const kind of ['hand-on', 'mid-event', 'between-events', 'ended'] as const) {
  seams[kind] = [];
  for (let i = 0; i < cuts; i++) {
    server.plan = { cuts: [{ after: 100, kind } as Cut] };
    seams[kind]!.push((await read(resumable, 200)).longestMs);
  }
}
server.plan = {};
const uncut: number[] = [];
for (let i = 0; i < cuts; i++) uncut.push((await read(resumable, 200)).longestMs);
await server.close();

const median = (v: number[]) => percentile(v, 50);
console.log(`client CPU per event, openai SDK reading a ${tokens}-token chat stream (median of ${rounds}):`);
console.log(`  plain           ${median(cpuPerEvent.plain).toFixed(2)} µs`);
console.log(`  resumableFetch  ${median(cpuPerEvent.resumable).toFixed(2)} µs (+${(median(cpuPerEvent.resumable) - median(cpuPerEvent.plain)).toFixed(2)} µs)`);
console.log(`longest pause between two chunks the SDK sees, ${cuts} streams each (p50 / p99 / max ms):`);
for (const [kind, v] of [...Object.entries(seams), ['uncut', uncut] as const]) console.log(`  ${kind.padEnd(15)} ${median(v).toFixed(1)} / ${percentile(v, 99).toFixed(1)} / ${Math.max(...v).toFixed(1)}`);
const summary = (v: number[]) => ({ p50: median(v), p99: percentile(v, 99), max: Math.max(...v) });
const seamMs = Object.fromEntries([...Object.entries(seams), ['uncut', uncut] as const].map(([kind, v]) => [kind, summary(v)]));
console.log(JSON.stringify({ tokens, rounds, cuts, cpuPerEventUs: cpuPerEvent, seamMs }));
