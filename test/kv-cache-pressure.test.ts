import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startKvFleet, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { streamCompletion, type StreamOutcome } from './helpers/sse.js';
import { words } from './helpers/words.js';

/**
 * A new conversation is not sent where it would evict a live one (issue 47 item 3): the kv router
 * weighs what a prompt's prefill would push out of a full cache (the blocks its worker stored
 * lately, of the capacity its KV snapshot names), the same at every frontend since all read the
 * same events. Two mocker workers with small caches (64 blocks of 16 tokens) and two kv router
 * frontends, A and B, as in bench/kv-affinity.ts: a conversation's turns land on different frontends.
 */
const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

const WORKER_ARGS = ['--model', 'm1', '--mocker-ttft-ms', '0', '--mocker-itl-ms', '5', '--mocker-max-context', '8192', '--mocker-kv-blocks', '64'];
/**
 * A shared system prompt: 2 whole blocks, cached wherever a conversation using it was prefilled.
 * Short beside the documents (40 blocks), so what it saves stays below what a document would evict
 * even when the frontend reads the stores many seconds late (they count half every 5 s).
 */
const SYSTEM = words(32, 's');
type Message = { role: string; content: string };
const conversation = (doc: string): Message[] => [
  { role: 'system', content: SYSTEM },
  { role: 'user', content: `${words(640, doc)} question 0` },
];
const send = (url: string, messages: Message[]) => streamCompletion(url, { model: 'm1', messages, max_tokens: 2, stream_options: { include_usage: true } });
const cachedTokens = (o: StreamOutcome) => (o.usage as { prompt_tokens_details?: { cached_tokens?: number } } | undefined)?.prompt_tokens_details?.cached_tokens ?? 0;

let workers: WorkerHandle[];
let a: FrontendHandle;
let b: FrontendHandle;

before(async () => {
  let frontends: FrontendHandle[];
  ({ workers, frontends } = await startKvFleet(WORKER_ARGS, { workers: 2, frontends: 2 }));
  started.push(...workers, ...frontends);
  [a, b] = frontends as [FrontendHandle, FrontendHandle];
});

describe('caches under pressure, several frontends', () => {
  it("send a new conversation where it evicts no live one, though a shared prefix is cached where one lives, and the live one's next turn finds its whole prompt", async () => {
    // Conversation X starts at A: its 43 or so blocks fill most of one worker's 64 (home).
    const markB = b.mark();
    const x = conversation('x');
    const first = await send(a.url, x);
    assert.equal(first.status, 200, first.error);
    const home = first.workerId!;
    const other = workers.find((w) => w.workerId !== home)!.workerId;
    const xBlocks = Math.floor(first.usage!.prompt_tokens / 16);
    // B read home's KV events: X's blocks are there.
    await b.waitForEvent('kv_indexed', (l) => l.worker_id === home && (l.cached_blocks as number) >= xBlocks, { after: markB });

    // Conversation Y starts at B, with the same system prompt: cheaper to prefill at home (the
    // system prompt is cached there), but its blocks would push X's out of home's full cache.
    const y = await send(b.url, conversation('y'));
    assert.equal(y.status, 200, y.error);
    const decision = b.logs.filter((l) => l.event === 'route_decision').at(-1);
    assert.equal(y.workerId, other, `B sent a new conversation to ${y.workerId}, where X holds ${xBlocks} of 64 blocks (the decision: ${JSON.stringify(decision?.scores)})`);

    // X's next turn, at B: where X lives, every whole block of its previous prompt cached.
    x.push({ role: 'assistant', content: first.text }, { role: 'user', content: 'question 1' });
    const next = await send(b.url, x);
    assert.equal(next.status, 200, next.error);
    assert.equal(next.workerId, home);
    assert.ok(cachedTokens(next) >= xBlocks * 16, `X's next turn found ${cachedTokens(next)} of its previous prompt's ${xBlocks * 16} tokens cached at ${home}`);
  });
});
