import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { EventEmitter, once } from 'node:events';
import { pino } from 'pino';
import { Admission, type Ticket } from '../src/lifecycle/admission.js';
import { Lifecycle, type Transition } from '../src/lifecycle/lifecycle.js';
import { checkMove, nextState, InvalidTransition, TRANSITIONS, WORKER_STATES, SHUTDOWN_STATES, type LifecycleEvent, type LifecycleState } from '../src/lifecycle/states.js';
import type { Engine, EngineStats, GeneratedPiece, Quiescence } from '../src/engine/engine.js';

const silent = pino({ level: 'silent' });

/** An engine whose idleness answers the test controls, including answers that arrive late. */
class ScriptedEngine implements Engine {
  readonly kind = 'scripted';
  readonly capabilities = { json_object: false, json_schema: false, logprobs: false, tools: false, max_context: null, continuation: false, prompt_token_ids: false, embeddings: false, sampling: false };
  readonly events = new EventEmitter();
  answer: Quiescence = { state: 'idle' };
  held: Array<(q: Quiescence) => void> = [];
  holdProbes = false;
  probes = 0;
  async *generate(): AsyncGenerator<GeneratedPiece, never, void> {
    throw new Error('not used');
  }
  probeQuiescence(): Promise<Quiescence> {
    this.probes++;
    if (this.holdProbes) return new Promise((resolve) => this.held.push(resolve));
    return Promise.resolve(this.answer);
  }
  onQuiescenceChange(listener: () => void) {
    this.events.on('change', listener);
    return () => this.events.off('change', listener);
  }
  changed() {
    this.events.emit('change');
  }
  isOverloaded() {
    return false;
  }
  stats(): EngineStats {
    return { kind: this.kind, running_sequences: 0, queued_sequences: 0, batch_slots: 1 };
  }
  async close() {}
}

function setup(registration?: { register(): Promise<void>; unregister(): Promise<void> }) {
  const engine = new ScriptedEngine();
  const admission = new Admission();
  const calls: string[] = [];
  const reg = registration ?? {
    register: async () => void calls.push(`register(open=${admission.open})`),
    unregister: async () => void calls.push(`unregister(open=${admission.open})`),
  };
  const lifecycle = new Lifecycle('w-test', admission, engine, reg, silent);
  const transitions: Transition[] = [];
  lifecycle.on('transition', (t: Transition) => transitions.push(t));
  return { engine, admission, lifecycle, calls, transitions };
}

function admit(admission: Admission): Ticket {
  const r = admission.admit('r');
  assert.ok(r.admitted);
  return r.ticket;
}

const flush = () => new Promise((resolve) => setImmediate(resolve));

describe('state table', () => {
  it('has exactly the documented moves', () => {
    assert.equal(nextState('serving', 'drain'), 'draining');
    assert.equal(nextState('draining', 'idle_confirmed'), 'drained');
    assert.equal(nextState('draining', 'resume'), 'serving');
    assert.equal(nextState('drained', 'resume'), 'serving');
    assert.equal(nextState('drained', 'drain'), 'drained');
    assert.equal(nextState('stopping', 'stopped'), 'stopped');
    assert.throws(() => nextState('serving', 'idle_confirmed'), InvalidTransition);
    assert.throws(() => nextState('drained', 'idle_confirmed'), InvalidTransition);
    assert.throws(() => nextState('serving', 'stopped'), InvalidTransition, 'only a shutdown stops');
    assert.equal(nextState('loading', 'start'), 'serving');
    assert.equal(nextState('loading', 'drain'), 'draining', 'drained before it ever registered');
    assert.throws(() => nextState('loading', 'resume'), InvalidTransition, 'nothing to resume before the first registration');
    for (const s of WORKER_STATES) {
      if (s === 'loading') continue;
      if (SHUTDOWN_STATES.has(s)) {
        assert.equal(TRANSITIONS[s].resume, undefined, `no resume from ${s}`);
        assert.equal(TRANSITIONS[s].drain, undefined, `no drain from ${s}`);
        assert.equal(TRANSITIONS[s].shutdown, undefined, `no second shutdown from ${s}`);
      } else {
        assert.equal(TRANSITIONS[s].resume, 'serving', `resume from ${s}`);
        assert.equal(TRANSITIONS[s].shutdown, 'stopping', `shutdown from ${s}`);
      }
    }
    assert.deepEqual(Object.keys(TRANSITIONS.stopped), [], 'stopped is final');
  });

  it('is the only way the state changes: the setter refuses a move the table lacks, and an update that renames the state', () => {
    assert.throws(() => checkMove('serving', 'idle_confirmed', 'drained'), InvalidTransition);
    assert.throws(() => checkMove('serving', 'drain', 'drained'), InvalidTransition, 'a drain from serving goes to draining, not further');
    assert.throws(() => checkMove('draining', null, 'drained'), InvalidTransition, 'only a move changes the state');
    assert.doesNotThrow(() => checkMove('draining', 'idle_confirmed', 'drained'));
    assert.doesNotThrow(() => checkMove('draining', null, 'draining'));
    // The setter is private, and no public operation asks it for a move the table lacks (each
    // refuses at its entry): reached by a cast, to see that it checks all the same.
    const { lifecycle, transitions } = setup();
    const set = (lifecycle as unknown as { set(next: LifecycleState, event?: LifecycleEvent | null): void }).set.bind(lifecycle);
    const drain = { reason: 'test', actor: 'test', handedOff: 0 };
    assert.throws(() => set({ name: 'drained', drain, calledAt: 0, deadline: null }, 'idle_confirmed'), InvalidTransition, 'loading is never drained by idleness');
    assert.throws(() => set({ name: 'serving' }), InvalidTransition, 'an update cannot move loading to serving');
    assert.equal(lifecycle.state, 'loading');
    assert.deepEqual(transitions, []);
  });

  it('holds each per-state field only in its state (the compiler checks the @ts-expect-error lines)', () => {
    const drain = { reason: 'test', actor: 'test', handedOff: 0 };
    // @ts-expect-error serving holds no drain
    const serving: LifecycleState = { name: 'serving', drain };
    // @ts-expect-error only failed and stopped hold an engine failure's cause
    const draining: LifecycleState = { name: 'draining', drain, calledAt: 0, deadline: null, probe: null, resuming: false, cause: 'boom' };
    // @ts-expect-error a drained worker waits for nothing: no idleness answer
    const drained: LifecycleState = { name: 'drained', drain, calledAt: 0, deadline: null, probe: null };
    // @ts-expect-error failed must say what the engine failed with
    const failed: LifecycleState = { name: 'failed', drain };
    assert.deepEqual([serving, draining, drained, failed].map((s) => s.name), ['serving', 'draining', 'drained', 'failed']);
  });
});

describe('admission', () => {
  it('releases each ticket exactly once and never goes negative', () => {
    const admission = new Admission();
    const t = admit(admission);
    let idle = 0;
    admission.on('idle', () => idle++);
    assert.equal(admission.inflight, 1);
    assert.equal(t.release('completed'), true);
    assert.equal(t.release('dropped'), false);
    assert.equal(admission.inflight, 0);
    assert.equal(idle, 1);
  });

  it('keeps draining and overload apart', () => {
    let overloaded = true;
    const admission = new Admission(() => overloaded);
    assert.deepEqual(admission.admit('a'), { admitted: false, code: 'worker_overloaded' });
    overloaded = false;
    admission.close();
    assert.deepEqual(admission.admit('a'), { admitted: false, code: 'worker_draining' });
  });
});

describe('lifecycle controller', () => {
  it('owns loading from the start: loading until the engine is loaded, no registration before it, then serving', async () => {
    const engine = new ScriptedEngine();
    const admission = new Admission();
    const calls: string[] = [];
    const lifecycle = new Lifecycle('w-test', admission, undefined, { register: async () => void calls.push('register'), unregister: async () => void calls.push('unregister') }, silent);
    assert.equal(lifecycle.state, 'loading');
    assert.equal(lifecycle.engineReady, false);
    assert.equal(lifecycle.status().state, 'loading');
    await assert.rejects(lifecycle.start(), /before the engine is loaded/);
    assert.deepEqual(calls, [], 'never registered before the engine is loaded');
    assert.equal(lifecycle.state, 'loading');
    lifecycle.engineLoaded(engine);
    assert.throws(() => lifecycle.engineLoaded(engine), /already loaded/);
    await lifecycle.start();
    assert.equal(lifecycle.state, 'serving');
    assert.deepEqual(calls, ['register']);
  });

  it('closes admission before unregistering, and registers before reopening it', async () => {
    const { lifecycle, calls } = setup();
    await lifecycle.start();
    await lifecycle.drain('test');
    await lifecycle.resume();
    assert.deepEqual(calls, ['register(open=true)', 'unregister(open=false)', 'register(open=false)']);
  });

  it('reaches drained on the release event, not before', async () => {
    const { lifecycle, admission } = setup();
    const t1 = admit(admission);
    const t2 = admit(admission);
    const status = await lifecycle.drain('test');
    assert.equal(status.state, 'draining');
    assert.equal(status.inflight_requests, 2);
    t1.release('completed');
    await flush();
    assert.equal(lifecycle.state, 'draining');
    t2.release('dropped');
    await lifecycle.whenDrained();
    assert.equal(lifecycle.state, 'drained');
  });

  it('fails closed when the engine cannot confirm idleness, and drains once it can', async () => {
    const { lifecycle, engine } = setup();
    engine.answer = { state: 'unknown', reason: 'no probe' };
    const status = await lifecycle.drain('test');
    assert.equal(status.state, 'draining');
    assert.match(status.waiting_for.join(), /unknown/);
    engine.answer = { state: 'busy', waiting_for: ['1 transfer'] };
    engine.changed();
    await flush();
    assert.deepEqual(lifecycle.status().waiting_for, ['1 transfer']);
    engine.answer = { state: 'idle' };
    engine.changed();
    await lifecycle.whenDrained();
  });

  it('fences a late idleness answer from an earlier drain cycle', async () => {
    const { lifecycle, admission, engine, transitions } = setup();
    const t1 = admit(admission);
    await lifecycle.drain('cycle 1');
    engine.holdProbes = true;
    t1.release('completed'); // cycle 1 asks the engine; its answer is held back
    await flush();
    assert.equal(engine.held.length, 1);
    const staleAnswer = engine.held.shift()!;
    engine.holdProbes = false;
    await lifecycle.resume();
    engine.answer = { state: 'busy', waiting_for: ['engine: 1 running'] };
    const second = await lifecycle.drain('cycle 2');
    assert.equal(second.state, 'draining');
    staleAnswer({ state: 'idle' }); // cycle 1's "idle" arrives while cycle 2's engine is busy
    await flush();
    assert.equal(lifecycle.state, 'draining');
    assert.ok(!transitions.some((x) => x.to === 'drained'), 'the stale idle answer must not drain any cycle');
    engine.answer = { state: 'idle' };
    engine.changed();
    await lifecycle.whenDrained();
    assert.equal(transitions.at(-1)?.generation, second.generation);
  });

  it('drains locally when discovery is down, says registration is unknown, and unregisters once it answers', async () => {
    let down = true;
    let unregisters = 0;
    let confirmed!: () => void;
    const unregistered = new Promise<void>((resolve) => (confirmed = resolve));
    const { lifecycle, admission } = setup({
      register: async () => undefined,
      unregister: async () => {
        unregisters++;
        if (down) throw new Error('etcd down');
        confirmed();
      },
    });
    await lifecycle.start();
    const status = await lifecycle.drain('outage');
    assert.equal(status.state, 'drained', 'closing admission needs no discovery');
    assert.equal(admission.open, false);
    assert.equal(status.discovery, 'unknown');
    assert.equal(status.discovery_registered, false, 'never claims a registration it cannot confirm');
    assert.match(status.last_error ?? '', /etcd down/);
    down = false;
    await unregistered; // the retry, once discovery answers
    await flush();
    assert.ok(unregisters >= 2);
    assert.equal(lifecycle.status().discovery, 'unregistered');
    assert.equal(lifecycle.state, 'drained');
  });

  it('stops retrying an unconfirmed unregister once a resume registered again', async () => {
    let down = true;
    let registered = 0;
    const order: string[] = [];
    const { lifecycle } = setup({
      register: async () => {
        registered++;
        order.push('register');
      },
      unregister: async () => {
        order.push('unregister');
        if (down) throw new Error('etcd down');
      },
    });
    await lifecycle.start();
    await lifecycle.drain('outage');
    down = false;
    const resumed = await lifecycle.resume();
    assert.equal(resumed.state, 'serving');
    assert.equal(resumed.discovery, 'registered');
    await new Promise((resolve) => setTimeout(resolve, 600)); // past the first retry back-off
    assert.equal(order.at(-1), 'register', `a late retry must not remove the fresh registration: ${order.join(',')}`);
    assert.equal(registered, 2);
  });

  it('keeps the state when registering on resume fails', async () => {
    let fail = false;
    const { lifecycle, admission } = setup({
      register: async () => {
        if (fail) throw new Error('etcd down');
      },
      unregister: async () => undefined,
    });
    await lifecycle.start();
    await lifecycle.drain('test');
    fail = true;
    await assert.rejects(lifecycle.resume(), /resume failed/);
    assert.equal(lifecycle.state, 'drained');
    assert.equal(admission.open, false);
  });

  it('does not report drained while a resume is registering, and admits nothing until it is done', async () => {
    let finishRegister!: () => void;
    let hold = false;
    const { lifecycle, admission, transitions } = setup({
      register: () => (hold ? new Promise<void>((resolve) => (finishRegister = resolve)) : Promise.resolve()),
      unregister: async () => undefined,
    });
    await lifecycle.start();
    const t = admit(admission);
    await lifecycle.drain('test');
    hold = true;
    const resuming = lifecycle.resume();
    await flush();
    assert.deepEqual(admission.admit('during resume'), { admitted: false, code: 'worker_draining' });
    t.release('completed'); // the last request ends while registration is pending
    await flush();
    assert.ok(!transitions.some((x) => x.to === 'drained'), 'no drained in the middle of a resume');
    finishRegister();
    assert.equal((await resuming).state, 'serving');
    assert.equal(admission.open, true);
  });

  it('refuses drain and resume once shutdown began, and shutdown only once', async () => {
    const { lifecycle } = setup();
    await lifecycle.drain('test');
    assert.equal(lifecycle.beginShutdown('test'), true);
    assert.equal(lifecycle.state, 'stopping');
    assert.equal(lifecycle.beginShutdown('again'), false);
    await assert.rejects(lifecycle.resume(), (err: Error & { status?: number }) => err.status === 409);
    await assert.rejects(lifecycle.drain('x'), (err: Error & { status?: number }) => err.status === 409);
  });

  it('SIGTERM during a resume: the resume does not reopen admission, and the shutdown unregisters again', async () => {
    let finishRegister!: () => void;
    let hold = false;
    const calls: string[] = [];
    const { lifecycle, admission } = setup({
      register: () => {
        calls.push('register');
        return hold ? new Promise<void>((resolve) => (finishRegister = resolve)) : Promise.resolve();
      },
      unregister: async () => void calls.push('unregister'),
    });
    await lifecycle.start();
    await lifecycle.drain('test');
    hold = true;
    const resuming = lifecycle.resume();
    await flush();
    lifecycle.beginShutdown('SIGTERM');
    const unregistering = lifecycle.unregisterForShutdown(new AbortController().signal);
    finishRegister();
    await assert.rejects(resuming, (err: Error & { status?: number }) => err.status === 409);
    assert.equal(admission.open, false, 'admission stays closed after shutdown began');
    assert.equal(lifecycle.state, 'stopping');
    assert.equal(await unregistering, 'completed', 'the registration the resume made is removed; grace is owed');
    assert.deepEqual(calls, ['register', 'unregister', 'register', 'unregister']);
  });

  it('SIGTERM during a resume: the shutdown asks the engine for idleness at once, not held by the registration', async () => {
    let finishRegister!: () => void;
    let hold = false;
    const { lifecycle, engine } = setup({
      register: () => (hold ? new Promise<void>((resolve) => (finishRegister = resolve)) : Promise.resolve()),
      unregister: async () => undefined,
    });
    await lifecycle.start();
    await lifecycle.drain('test');
    assert.equal(lifecycle.state, 'drained');
    hold = true;
    const resuming = lifecycle.resume();
    await flush();
    const probes = engine.probes;
    lifecycle.beginShutdown('SIGTERM');
    // Nothing is in flight: no release and no engine change would ask again, so a shutdown that did
    // not ask here would wait out its whole drain timeout.
    assert.equal(engine.probes, probes + 1, 'the shutdown asked the engine whether it is idle while the resume was still registering');
    await lifecycle.whenQuiescent();
    finishRegister();
    await assert.rejects(resuming, (err: Error & { status?: number }) => err.status === 409);
  });

  it('SIGTERM during a failing drain: admission stays closed and the shutdown keeps unregistering until its budget ends', async () => {
    let down = true;
    const { lifecycle, admission } = setup({
      register: async () => undefined,
      unregister: async () => {
        if (down) throw new Error('etcd down');
      },
    });
    await lifecycle.start();
    await lifecycle.drain('outage');
    lifecycle.beginShutdown('SIGTERM');
    assert.equal(admission.open, false);
    assert.equal(await lifecycle.unregisterForShutdown(AbortSignal.timeout(300)), 'timed_out');
    assert.equal(admission.open, false, 'no rollback reopens admission during shutdown');
    down = false;
    assert.equal(await lifecycle.unregisterForShutdown(AbortSignal.timeout(5000)), 'completed');
    assert.equal(await lifecycle.unregisterForShutdown(AbortSignal.timeout(5000)), 'skipped', 'nothing left to unregister');
  });

  it('stopping: quiescent only after the last request and an idle engine', async () => {
    const { lifecycle, admission, engine } = setup();
    await lifecycle.start();
    const t = admit(admission);
    engine.answer = { state: 'busy', waiting_for: ['engine: 1 running'] };
    lifecycle.beginShutdown('SIGTERM');
    let quiescent = false;
    const waiting = lifecycle.whenQuiescent().then(() => (quiescent = true));
    t.release('completed');
    await flush();
    assert.equal(quiescent, false, 'the engine is still busy');
    assert.deepEqual(lifecycle.status().waiting_for, ['engine: 1 running']);
    engine.answer = { state: 'idle' };
    engine.changed();
    await waiting;
    lifecycle.stopped();
    assert.equal(lifecycle.state, 'stopped');
  });

  it('drains without touching discovery when the registration was already lost', async () => {
    let unregisters = 0;
    let down = false;
    const { lifecycle } = setup({
      register: async () => {
        if (down) throw new Error('etcd down');
      },
      unregister: async () => {
        unregisters++;
        throw new Error('etcd down');
      },
    });
    await lifecycle.start();
    down = true;
    const lost = lifecycle.registrationLost(); // retries in the background while etcd is down
    const status = await lifecycle.drain('etcd outage');
    assert.equal(status.state, 'drained');
    assert.equal(unregisters, 0);
    await lost; // the retry loop stops once the worker is no longer serving
  });

  it('registers again when the lease is lost while a resume is registering', async () => {
    let registers = 0;
    let finishRegister: (() => void) | undefined;
    const { lifecycle } = setup({
      register: () => {
        registers++;
        return registers === 2 ? new Promise<void>((resolve) => (finishRegister = resolve)) : Promise.resolve();
      },
      unregister: async () => undefined,
    });
    await lifecycle.start();
    await lifecycle.drain('test');
    const resumed = lifecycle.resume(); // registers (call 2), held
    await flush();
    const lost = lifecycle.registrationLost(); // the lease goes while that call is in flight
    finishRegister!();
    await resumed;
    await lost;
    assert.equal(registers, 3, 'the registration made under the lost lease is redone');
    assert.equal(lifecycle.status().discovery_registered, true);
  });

  it('re-registers a lost registration only while serving', async () => {
    const { lifecycle, calls } = setup();
    await lifecycle.start();
    await lifecycle.registrationLost();
    assert.equal(calls.filter((c) => c.startsWith('register')).length, 2);
    await lifecycle.drain('test');
    await lifecycle.registrationLost();
    assert.equal(calls.filter((c) => c.startsWith('register')).length, 2, 'no re-register while drained');
  });
});

describe('drain deadline', () => {
  it('asks for a hand-off when the deadline passes with work in flight, and reaches drained only once it is released', async () => {
    const { lifecycle, admission } = setup();
    const t = admit(admission);
    const due = once(lifecycle, 'handoff_due');
    const status = await lifecycle.drain('test', { deadlineMs: 0 });
    assert.equal(status.state, 'draining');
    assert.equal(typeof status.drain_deadline, 'string');
    assert.match(status.waiting_for.join('; '), /hand/);
    await due;
    assert.equal(lifecycle.state, 'draining', 'a due hand-off is not drained: the stream still runs until it is released');
    lifecycle.recordHandoffs(1);
    t.release('handed_off');
    await lifecycle.whenDrained();
    assert.equal(lifecycle.status().handed_off, 1);
  });

  it("handed_off is this drain's: serving after a resume holds no drain, so none of its count", async () => {
    const { lifecycle, admission } = setup();
    const t = admit(admission);
    await lifecycle.drain('first');
    lifecycle.recordHandoffs(1);
    assert.equal(lifecycle.status().handed_off, 1);
    t.release('handed_off');
    await lifecycle.whenDrained();
    const resumed = await lifecycle.resume();
    assert.equal(resumed.state, 'serving');
    assert.equal(resumed.handed_off, 0, 'no drain under way, nothing handed off');
    assert.equal(resumed.drain_reason, null);
  });

  it('is cleared by a resume: no hand-off after it', async () => {
    const { lifecycle, admission } = setup();
    admit(admission);
    let handoffs = 0;
    lifecycle.on('handoff_due', () => handoffs++);
    await lifecycle.drain('test', { deadlineMs: 1 });
    await lifecycle.resume();
    assert.equal(lifecycle.status().drain_deadline, null);
    await new Promise((resolve) => setTimeout(resolve, 20));
    assert.equal(handoffs, 0);
  });

  it('an earlier deadline from a second drain call replaces a later one; a later one does not', async () => {
    const { lifecycle, admission } = setup();
    admit(admission);
    const first = await lifecycle.drain('test', { deadlineMs: 60_000 });
    const earlier = await lifecycle.drain('test', { deadlineMs: 30_000 });
    assert.ok(Date.parse(earlier.drain_deadline!) < Date.parse(first.drain_deadline!));
    const later = await lifecycle.drain('test', { deadlineMs: 120_000 });
    assert.equal(later.drain_deadline, earlier.drain_deadline);
    await lifecycle.resume();
  });
});
