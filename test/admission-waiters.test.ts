import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { metricValue, startFleet, type EbbProcess, type FrontendHandle, type LogLine } from './helpers/processes.js';

/**
 * The admission queue's waiters (issue 42): one a worker cannot take does not hold the others'
 * turn.
 */
const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

/** Far longer than any case: a stream that runs until the test aborts it. */
const ENDLESS = 100_000;

const completion = (frontend: FrontendHandle, extra: Record<string, unknown> = {}, signal?: AbortSignal) =>
  fetch(`${frontend.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'm1', prompt: 'x', max_tokens: 2, ...extra }), signal });

/** Resolves once the frontend has logged `count` lines with `event` after `from`. */
function events(frontend: EbbProcess, event: string, count: number, from: number, pred: (l: LogLine) => boolean = () => true): Promise<LogLine> {
  let seen = 0;
  return frontend.waitForLog((l) => l.event === event && pred(l) && ++seen === count, `${count} ${event} log line(s)`, { after: from });
}

/** A stream through the frontend, once its first bytes came: the reader, and how to end it. */
async function openStream(frontend: FrontendHandle, extra: Record<string, unknown>) {
  const controller = new AbortController();
  const res = await completion(frontend, { stream: true, max_tokens: ENDLESS, ...extra }, controller.signal);
  assert.equal(res.status, 200);
  const reader = res.body!.getReader();
  await reader.read();
  return {
    end: async () => {
      controller.abort();
      await reader.closed.catch(() => undefined);
    },
  };
}

describe('admission queue: a waiter no worker can take holds no turn', () => {
  it("a request whose adapter's slot is busy waits without blocking the base model's requests behind it", async () => {
    // One adapter slot, held by a1's endless stream: a2 cannot be taken until it ends; the base model can, beside it.
    const lora = ['--mocker-lora', 'a1', '--mocker-lora', 'a2', '--mocker-lora-slots', '1', '--mocker-batch-slots', '8', '--mocker-itl-ms', '20'];
    const { frontend, workers } = await startFleet(1, lora, ['--queue-timeout', '10000', '--resume-grace-ms', '0']);
    started.push(frontend, ...workers);
    const a1 = await openStream(frontend, { model: 'a1' });
    const mark = frontend.mark();
    const a2 = completion(frontend, { model: 'a2' });
    await events(frontend, 'request_queued', 1, mark);
    const base = [0, 1, 2].map(() => completion(frontend));
    const answers = await Promise.all(base);
    assert.deepEqual(
      answers.map((r) => r.status),
      [200, 200, 200],
      'the base requests are served while a2 waits for its slot (was: 429 at the queue timeout, behind a2)',
    );
    assert.equal(await metricValue(frontend.url, 'ebb_frontend_queue_depth', 'model="m1",tier="default",tenant="anonymous"'), 1, 'a2 still waits');
    await a1.end();
    assert.equal((await a2).status, 200, "a2 is served once a1's stream freed the slot");
  });
});
