import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { pino } from 'pino';
import { Admission } from '../src/lifecycle/admission.js';
import type { AuditEvent } from '../src/lifecycle/audit.js';
import { Lifecycle, ShutdownConflict } from '../src/lifecycle/lifecycle.js';
import type { Engine, EngineStats, GeneratedPiece, Quiescence } from '../src/engine/engine.js';

/** An engine that is always idle: these tests are about what the controller does around it. */
class IdleEngine implements Engine {
  readonly kind = 'idle';
  readonly capabilities = { json_object: false, json_schema: false, logprobs: false, tools: false, max_context: null, continuation: false, prompt_token_ids: false, embeddings: false, sampling: false };
  async *generate(): AsyncGenerator<GeneratedPiece, never, void> {
    throw new Error('not used');
  }
  probeQuiescence(): Promise<Quiescence> {
    return Promise.resolve({ state: 'idle' });
  }
  onQuiescenceChange() {
    return () => undefined;
  }
  isOverloaded() {
    return false;
  }
  stats(): EngineStats {
    return { kind: this.kind, running_sequences: 0, queued_sequences: 0, batch_slots: 1 };
  }
  async close() {}
}

function setup(register: () => Promise<void> = async () => undefined) {
  const admission = new Admission();
  const lifecycle = new Lifecycle('w-test', admission, new IdleEngine(), { register, unregister: async () => undefined }, pino({ level: 'silent' }));
  return { admission, lifecycle };
}

describe('an operation refused at shutdown has no effect', () => {
  it('a drain queued behind a resume and refused with 409 once SIGTERM came does not arm its deadline', async () => {
    let registered!: () => void;
    const { lifecycle, admission } = setup(() => new Promise<void>((resolve) => (registered = resolve)));
    const ticket = admission.admit('r');
    assert.ok(ticket.admitted);
    await lifecycle.drain('first', {});
    const resuming = lifecycle.resume(); // holds the chain while it registers
    const drain = lifecycle.drain('second', { deadlineMs: 0 }); // queued behind it
    await new Promise((resolve) => setImmediate(resolve)); // the resume is registering
    let handoffs = 0;
    lifecycle.on('handoff_due', () => handoffs++);
    const shutdownDeadline = Date.now() + 60_000;
    assert.equal(lifecycle.beginShutdown('signal SIGTERM', shutdownDeadline), true);
    registered();
    await assert.rejects(resuming, ShutdownConflict);
    await assert.rejects(drain, ShutdownConflict);
    assert.equal(lifecycle.status().drain_deadline, new Date(shutdownDeadline).toISOString(), 'the shutdown keeps its own hand-off time');
    await new Promise((resolve) => setTimeout(resolve, 20));
    assert.equal(handoffs, 0, 'no hand-off from a refused drain');
    ticket.ticket.release('completed');
  });
});

describe('audit order', () => {
  it('`drained` is dated when the worker drained, after the hand-off that led to it, and listed after it', async () => {
    const { lifecycle, admission } = setup();
    const admitted = admission.admit('r');
    assert.ok(admitted.admitted);
    const due = once(lifecycle, 'handoff_due');
    await lifecycle.drain('rebalance', { deadlineMs: 5 });
    await due;
    let closed!: () => void;
    lifecycle.recordHandoffs(1, new Promise<void>((resolve) => (closed = resolve)));
    await new Promise((resolve) => setTimeout(resolve, 10)); // the stream takes a while to end
    const drainedRecord = new Promise<AuditEvent>((resolve) => lifecycle.audit.on('event', (e: AuditEvent) => e.what === 'drained' && resolve(e)));
    admitted.ticket.release('handed_off');
    closed();
    const drained = await drainedRecord;
    const trail = lifecycle.audit.list();
    assert.deepEqual(trail.map((e) => e.what), ['drain', 'handoff', 'drained']);
    const [drain, handoff] = trail as [AuditEvent, AuditEvent];
    assert.ok(Date.parse(drained.at) >= Date.parse(handoff.at), `drained at ${drained.at}, hand-off at ${handoff.at}`);
    assert.ok(Date.parse(drained.at) >= Date.parse(drain.at) + drained.duration_ms - 1, 'its duration still spans the whole drain, from the call');
    const sorted = [...trail].sort((a, b) => Date.parse(a.at) - Date.parse(b.at));
    assert.equal(sorted.at(-1)?.what, 'drained', 'sorted by time, it is still last');
  });
});

describe('loading is a state', () => {
  it('a worker drained before its first registration never registers; a resume before it is refused', async () => {
    let registers = 0;
    const { lifecycle } = setup(async () => void registers++);
    assert.equal(lifecycle.state, 'loading');
    await assert.rejects(lifecycle.resume(), (err: Error & { code?: string }) => err.code === 'worker_loading');
    assert.equal(lifecycle.state, 'loading', 'refused before any effect');
    await lifecycle.drain('drained while registering');
    await lifecycle.start(); // the first registration's attempt comes after the drain
    assert.equal(registers, 0, 'a drained worker is not put in discovery');
    assert.equal(lifecycle.state, 'drained');
    await lifecycle.resume();
    assert.equal(registers, 1);
    assert.equal(lifecycle.state, 'serving');
  });
});
