/**
 * The llama-cpp engine's priority gate (src/engine/priority-gate.ts): flex sequences pass only while
 * no holder holds it, a waiting one leaves on its abort, every holder's release counts once.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { PriorityGate } from '../src/engine/priority-gate.js';

/** Whether `p` has settled after the microtasks queued now have run. */
async function settled(p: Promise<unknown>): Promise<'resolved' | 'rejected' | 'pending'> {
  let state: 'resolved' | 'rejected' | 'pending' = 'pending';
  p.then(
    () => (state = 'resolved'),
    () => (state = 'rejected'),
  );
  await new Promise((resolve) => setImmediate(resolve));
  return state;
}

describe('priority gate', () => {
  it('passes at once while open; holds until every holder let go, a second release of one holder counting nothing', async () => {
    const gate = new PriorityGate();
    const signal = new AbortController().signal;
    assert.equal(await settled(gate.passed(signal)), 'resolved');
    const a = gate.hold();
    const b = gate.hold();
    const waiting = gate.passed(signal);
    a();
    a();
    assert.equal(await settled(waiting), 'pending', 'b still holds it (a released twice)');
    assert.equal(gate.stats.priority_gate_held, true);
    b();
    assert.equal(await settled(waiting), 'resolved');
    assert.equal(gate.stats.priority_gate_held, false);
  });

  it('a waiter whose signal aborts leaves with the abort reason; an aborted one is refused at once', async () => {
    const gate = new PriorityGate();
    const release = gate.hold();
    const ac = new AbortController();
    const waiting = gate.passed(ac.signal);
    ac.abort(new Error('client left'));
    await assert.rejects(waiting, /client left/);
    await assert.rejects(gate.passed(ac.signal), /client left/);
    release();
    assert.equal(await settled(gate.passed(ac.signal)), 'resolved', 'open: nothing to wait for');
  });

  it('counts flex tokens only while held', () => {
    const gate = new PriorityGate();
    gate.flexToken();
    const release = gate.hold();
    gate.flexToken();
    gate.flexToken();
    release();
    gate.flexToken();
    assert.equal(gate.stats.flex_tokens_while_priority_gate_held, 2);
  });
});
