import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { call } from './helpers/http.js';
import { startKvFleet, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { streamCompletion } from './helpers/sse.js';
import { words } from './helpers/words.js';

/**
 * Several frontends route as one (issue 47): a request one frontend routed is counted by the others
 * before the worker's KV events can say anything of it. Two mocker workers whose prefill is slow
 * (100 uncached prompt tokens a second: a 300-word prompt is queued there for seconds) and two kv
 * router frontends, A and B, on one discovery. Each /generate names its frontend and the prefill it
 * predicted; the worker tells every frontend on its KV event stream (`load` events).
 */
const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

const WORKER_ARGS = ['--model', 'm1', '--mocker-ttft-ms', '0', '--mocker-itl-ms', '5', '--mocker-max-context', '8192', '--mocker-prefill-tokens-per-s', '100'];
/** A shared system prompt: 8 whole blocks wherever it was prefilled. */
const SYSTEM = words(128, 's');
const chat = (user: string, maxTokens = 1) => ({ model: 'm1', messages: [{ role: 'system', content: SYSTEM }, { role: 'user', content: user }], max_tokens: maxTokens });

let workers: WorkerHandle[];
let a: FrontendHandle;
let b: FrontendHandle;
let adminA: string;

before(async () => {
  let frontends: FrontendHandle[];
  ({ workers, frontends } = await startKvFleet(WORKER_ARGS, { workers: 2, frontends: 2 }));
  started.push(...workers, ...frontends);
  [a, b] = frontends as [FrontendHandle, FrontendHandle];
  adminA = (await a.waitForEvent('admin_ready')).url as string;
});

describe('frontends sharing one fleet', () => {
  it("count the prompts another frontend sent a worker and it has not prefilled yet, and route a new one elsewhere, as one frontend would", async () => {
    // The system prompt is cached on one worker (home), and both frontends indexed it there.
    const markB = b.mark();
    const warm = await streamCompletion(a.url, chat('hello'));
    assert.equal(warm.status, 200);
    const home = warm.workerId!;
    const other = workers.find((w) => w.workerId !== home)!.workerId;
    await b.waitForEvent('kv_indexed', (l) => l.worker_id === home && (l.cached_blocks as number) >= 8, { after: markB });

    // A sends a long new prompt: it goes where the system prompt is, and is prefilled there for seconds.
    const sentMark = b.mark();
    const longA = streamCompletion(a.url, chat(words(300, 'a'), 2));
    // B hears of it from the worker before any KV event could say it (the prompt is not stored until prefilled).
    const heard = await b.waitForEvent('kv_load', (l) => l.worker_id === home && (l.queued_prefill_tokens as number) > 0, { after: sentMark });
    const own = (await call('GET', `${adminA}/workers/${home}`)).body.kv;
    assert.equal(heard.queued_prefill_tokens, own.queued_prefill_tokens, "B counts what A predicted it queued there, exactly");
    assert.equal(heard.inflight, 1);

    // B's new prompt of the same shape would be cheaper there (the system prompt is cached): with A's prefill queued there it goes to the other worker.
    const longB = await streamCompletion(b.url, chat(words(300, 'b')));
    assert.equal(longB.status, 200);
    assert.equal(longB.workerId, other, `B routed its prompt to ${longB.workerId}, where A's is queued for prefill (${heard.queued_prefill_tokens} tokens)`);

    const doneA = await longA;
    assert.equal(doneA.workerId, home, "A's prompt went where the system prompt was cached");
    // Once A's request is over, B is told: nothing of A's is left counted there.
    await b.waitForEvent('kv_load', (l) => l.worker_id === home && l.inflight === 0 && l.queued_prefill_tokens === 0, { after: b.logs.indexOf(heard) + 1 });
  });
});
