/**
 * A spare sequence for preemption (llama-cpp --preemption-spare-sequence, src/engine/spare-sequence.ts),
 * in process on a real llama.cpp: both batch slots run flex streams, a priority request waits, one
 * stream is paused with its state handed off. Without the spare the priority request waits until the
 * paused sequence has ended its decode and written its state; with it, it holds the slot and a
 * sequence before that state is named. Two pauses at once: the spare is lent once, the second paused
 * stream keeps its slot until its sequence is back, and no request finds every sequence taken.
 * While the paused stream holds the spare the engine is not idle (a drain waits for its state).
 */
import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { loadLlamaCppEngine, type LlamaCppEngine, type LlamaCppOptions } from '../src/engine/llama-cpp.js';
import { PausedForContinuation, type EngineStats, type GenerateRequest, type Quiescence } from '../src/engine/engine.js';
import { createLogger } from '../src/common/logger.js';
import { writeTinyLlamaGguf } from './helpers/gguf.js';
import { drainGeneration as drain } from './helpers/generation.js';
import { bounded } from './helpers/processes.js';

const options: LlamaCppOptions = { modelPath: writeTinyLlamaGguf(), parallel: 2, maxQueue: 4, contextSize: 512, threads: 1, gpu: 'off' };
const live = new AbortController().signal;

const engines: LlamaCppEngine[] = [];
after(async () => {
  await Promise.all(engines.map((e) => e.close()));
});

async function engine(spare: boolean): Promise<LlamaCppEngine> {
  const e = await loadLlamaCppEngine({ ...options, preemptionSpareSequence: spare }, createLogger('test'), live);
  engines.push(e);
  return e;
}

const request = (extra: Partial<GenerateRequest>): GenerateRequest => ({ request_id: 'r', prompt: 'hello', max_tokens: 200, temperature: 0, ...extra });

/**
 * Both slots run flex streams; `pauses` priority requests queue; the first `pauses` flex streams are
 * paused with their state handed off. Returns the engine's stats as each paused stream's state was
 * named, and the priority requests' completion tokens.
 */
async function preempt(e: LlamaCppEngine, pauses: 1 | 2): Promise<{ atExport: EngineStats[]; idlenessAtExport: Quiescence[]; priorityTokens: number[] }> {
  const controllers = [new AbortController(), new AbortController()];
  const atExport: EngineStats[] = [];
  const idleness: Array<Promise<Quiescence>> = [];
  const transfers: string[] = [];
  const flex = controllers.map((c, i) =>
    e.generate(
      request({
        request_id: `flex${i}`,
        prompt: `question ${i}: tell me about the tides and the moon`,
        tier: 'flex',
        kv_handoff: {
          wanted: (reason) => reason instanceof PausedForContinuation && reason.reason === 'preempted',
          exported: (t) => {
            transfers.push(t.transfer_id);
            atExport.push(e.stats());
            idleness.push(e.probeQuiescence());
          },
        },
      }),
      c.signal,
    ),
  );
  for (const f of flex) assert.equal((await f.next()).done, false, 'a flex stream runs');
  const priority = Array.from({ length: pauses }, (_, i) => e.generate(request({ request_id: `priority${i}`, prompt: `a priority question ${i}`, max_tokens: 4, tier: 'priority' }), live));
  const firsts = priority.map((p) => p.next());
  await bounded(
    (async () => {
      while (e.stats().queued_sequences < pauses) await new Promise((r) => setImmediate(r));
    })(),
    `${pauses} priority request(s) queued for a slot`,
  );
  for (let i = 0; i < pauses; i++) controllers[i]!.abort(new PausedForContinuation('a priority request took its slot', 'preempted'));
  // A token already decoded may come first; then the pause.
  await Promise.all(flex.slice(0, pauses).map((f) => assert.rejects(drain(f))));
  const priorityTokens: number[] = [];
  for (const [i, p] of priority.entries()) {
    assert.equal((await firsts[i]!).done, false, `priority ${i} has its first token`);
    priorityTokens.push((await drain(p)).result.completion_tokens);
  }
  for (const c of controllers.slice(pauses)) c.abort(new Error('test over'));
  await Promise.all(flex.slice(pauses).map((f) => assert.rejects(drain(f))));
  assert.equal(transfers.length, pauses, 'each paused stream handed its state off');
  for (const id of transfers) assert.equal(e.kvTransfers.complete(id), true);
  return { atExport, idlenessAtExport: await Promise.all(idleness), priorityTokens };
}

describe('llama-cpp --preemption-spare-sequence', () => {
  it("a priority request that pauses a flex stream holds a slot and a sequence before the paused stream's state is named (without the spare: still queued)", async () => {
    const spare = await engine(true);
    assert.equal(spare.describe().preemption_spare_sequence, true);
    const on = await preempt(spare, 1);
    const seen = on.atExport[0]!;
    assert.equal(seen.queued_sequences, 0, 'the priority request had the slot before the paused stream wrote its state');
    assert.equal(seen.running_sequences, 2, 'batch slots stay --parallel: the priority request and the other flex stream');
    assert.equal(seen.spare_sequence, 'lent', 'the paused stream held the spare while it wrote its state');
    assert.equal(seen.sequences_taken, 3, 'the priority request took the spare sequence; the paused one was still taken');
    const idleness = on.idlenessAtExport[0]!;
    assert.ok(idleness.state === 'busy' && idleness.waiting_for.some((w) => /a paused stream writing its KV state/.test(w)), `a drain waits for the paused stream's sequence, its slot back or not: ${JSON.stringify(idleness)}`);
    assert.deepEqual(on.priorityTokens, [4]);
    const done = spare.stats();
    assert.equal(done.spare_sequence, 'free', "the paused stream's sequence is the spare now");
    assert.equal(done.spare_sequence_lent_total, 1);
    assert.equal(done.sequences_taken, 0);
    assert.deepEqual(await spare.probeQuiescence(), { state: 'idle' });

    // The same without the option: the priority request waited for the paused stream's state.
    const without = await preempt(await engine(false), 1);
    assert.equal(without.atExport[0]!.queued_sequences, 1, 'without the spare the priority request waits for the paused sequence');
    assert.equal(without.atExport[0]!.spare_sequence, 'off');
    assert.deepEqual(without.priorityTokens, [4]);
  });

  it('two pauses at once: the spare is lent once, the second paused stream keeps its slot until its sequence is back, both priority requests are answered', async () => {
    const e = await engine(true);
    const before = e.stats().spare_sequence_lent_total as number;
    const { atExport, priorityTokens } = await preempt(e, 2);
    assert.equal(atExport.length, 2);
    assert.equal((e.stats().spare_sequence_lent_total as number) - before, 1, 'one paused stream lent the spare; the other waited as without one');
    assert.deepEqual(priorityTokens, [4, 4], 'no priority request found every sequence taken');
    assert.equal(e.stats().spare_sequence, 'free');
    assert.equal(e.stats().sequences_taken, 0);
  });
});
