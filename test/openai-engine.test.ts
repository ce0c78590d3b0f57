/**
 * --engine openai: real worker processes in front of engine simulators (test/helpers/engine-sim.ts),
 * one per kind. With EBB_TEST_ENGINE_URL and EBB_TEST_ENGINE_KIND set, the tests that need no
 * simulator knob run against that real engine server instead (README: "Running in front of vLLM").
 */
import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { pino, type Logger } from 'pino';
import { createEngine } from '../src/engine/create-engine.js';
import { freePort } from '../src/engine/engine-process.js';
import type { Engine, GenerateRequest } from '../src/engine/engine.js';
import type { EngineKind } from '../src/engine/engine-quiescence.js';
import { startEngineSim, type EngineSim, type EngineSimOptions, type SimKind } from './helpers/engine-sim.js';
import { call, openLineStream } from './helpers/http.js';
import { assertTokenLogprob, textLines } from './helpers/logprobs.js';
import { bounded, metricValues, spawnEbb, startWorker, tempDiscoveryUrl, type LogLine, type WorkerHandle } from './helpers/processes.js';

const REAL_URL = process.env.EBB_TEST_ENGINE_URL;
const REAL_KIND = process.env.EBB_TEST_ENGINE_KIND as EngineKind | undefined;
const real = REAL_URL !== undefined && REAL_KIND !== undefined;
/** Tests that steer the engine (busy, slow, garbage, dead) need the simulator. */
const simOnly = real ? 'EBB_TEST_ENGINE_URL is set: this test needs a simulator knob' : false;

const here = dirname(fileURLToPath(import.meta.url));
const SIM_CLI = join(here, 'helpers', 'engine-sim-cli.js');
const simCmd = (args: string) => `"${process.execPath}" "${SIM_CLI}" --port {port} ${args}`;

const sims: EngineSim[] = [];
const workers: WorkerHandle[] = [];
const engines: Engine[] = [];
after(async () => {
  await Promise.all(workers.map((w) => w.stop()));
  await Promise.all(engines.map((e) => e.close()));
  await Promise.all(sims.map((s) => s.close()));
});

async function sim(kind: SimKind, opts: Partial<EngineSimOptions> = {}): Promise<EngineSim> {
  const s = await startEngineSim({ kind, itlMs: 25, ...opts });
  sims.push(s);
  return s;
}

async function worker(args: string[]): Promise<WorkerHandle & { discoveryDir: string }> {
  const url = tempDiscoveryUrl();
  const w = await startWorker(['--discovery', url, '--model', 'm1', '--engine', 'openai', ...args]);
  workers.push(w);
  return Object.assign(w, { discoveryDir: fileURLToPath(url) });
}

/** A worker in front of a fresh simulator of `kind`, or of the real engine when one is configured. */
async function fronted(kind: SimKind, args: string[] = [], opts: Partial<EngineSimOptions> = {}): Promise<{ w: WorkerHandle & { discoveryDir: string }; s: EngineSim | undefined }> {
  if (real) return { w: await worker(['--engine-url', REAL_URL, '--engine-kind', kind === 'generic' ? 'generic' : REAL_KIND, ...args]), s: undefined };
  const s = await sim(kind, opts);
  return { w: await worker(['--engine-url', s.url, '--engine-kind', kind, ...args]), s };
}

/** A real engine is fast: its streams get a prompt asking for a long answer, and room for it. */
const gen = (w: WorkerHandle, body: Record<string, unknown> = {}) =>
  openLineStream(`${w.requestUrl}/generate`, {
    model: 'm1',
    ...(real ? { prompt: 'Write a very long story about the tides, the river and the harbor.', max_tokens: 400 } : { prompt: 'tell me about tides', max_tokens: 20 }),
    ...body,
  });

function tokensOf(lines: string[]): { tokens: number; text: string; last: any } {
  const parsed = lines.map((l) => JSON.parse(l));
  const pieces = parsed.filter((p) => typeof p.text === 'string');
  return { tokens: pieces.length, text: pieces.map((p) => p.text).join(''), last: parsed.at(-1) };
}

const status = async (w: WorkerHandle) => (await call('GET', `${w.systemUrl}/engine/status`)).body;
const drained = (w: WorkerHandle, after = 0) => w.waitForEvent('state_changed', (l) => l.to === 'drained', { after });

/** A logger for engines built in this process; `lines` collects what they log. */
function captureLog(): { log: Logger; lines: LogLine[]; next(event: string): Promise<LogLine> } {
  const lines: LogLine[] = [];
  const waiters: Array<{ event: string; resolve: (l: LogLine) => void }> = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      for (const text of chunk.toString('utf8').split('\n').filter(Boolean)) {
        const l = JSON.parse(text) as LogLine;
        lines.push(l);
        for (const w of waiters.filter((w) => w.event === l.event)) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve(l);
        }
      }
      done();
    },
  });
  return {
    log: pino({ level: 'info' }, sink),
    lines,
    next: (event) => {
      const seen = lines.find((l) => l.event === event);
      if (seen) return Promise.resolve(seen);
      return bounded(new Promise<LogLine>((resolve) => waiters.push({ event, resolve })), `engine log event ${event}`);
    },
  };
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

const kinds: SimKind[] = real ? [REAL_KIND as SimKind] : ['vllm', 'sglang', 'llamacpp'];

describe('--engine openai: drained from the engine\'s own pending-work signal', () => {
  for (const kind of kinds) {
    it(`${kind}: draining while 3 streams run, every token delivered, drained once the engine reports 0`, async () => {
      const { w, s } = await fronted(kind);
      const streams = await Promise.all([0, 1, 2].map((i) => gen(w, { seed: i })));
      await Promise.all(streams.map((st) => st.first));
      const drain = await call('POST', `${w.systemUrl}/engine/drain`);
      assert.equal(drain.status, 202);
      assert.equal(drain.body.state, 'draining');
      assert.equal(drain.body.inflight_requests, 3);
      for (const st of streams) {
        const { tokens, last } = tokensOf(await st.done);
        assert.equal(last.done, true);
        assert.equal(last.usage.completion_tokens, tokens, 'usage from the engine matches the pieces delivered');
        if (s) assert.equal(tokens, 20);
      }
      await drained(w);
      assert.equal((await status(w)).state, 'drained');
      if (s) {
        assert.ok(s.scrapes > 0, 'the drain was confirmed by reading the engine\'s /metrics');
        assert.equal(s.seen.length, 3);
        assert.equal(s.seen[0]?.body.stream_options?.include_usage, true);
      }
    });
  }

  it("vllm: the worker's picker metrics are vLLM's own: running and waiting summed over its engines, KV use the fullest engine's", { skip: simOnly }, async () => {
    const { w, s } = await fronted('vllm');
    const series = ['vllm:num_requests_running{model_name="m1"}', 'vllm:num_requests_waiting{model_name="m1"}', 'vllm:kv_cache_usage_perc{model_name="m1"}'];
    // Work of another client on vLLM, which the worker's own count cannot see.
    s!.holdBusy(2, 3);
    try {
      assert.deepEqual(await metricValues(w.systemUrl, series), [2, 3, 0.5]);
    } finally {
      s!.release();
    }
  });

  it('llamacpp without --metrics: drained from /slots once no slot is processing', { skip: simOnly }, async () => {
    const { w, s } = await fronted('llamacpp', [], { slotsOnly: true });
    const st = await gen(w, { max_tokens: 10 });
    await st.first;
    s!.holdBusy(1, 0);
    const drain = await call('POST', `${w.systemUrl}/engine/drain`);
    assert.equal(drain.body.state, 'draining');
    assert.equal(tokensOf(await st.done).tokens, 10);
    await bounded(s!.nextScrape(), 'a probe of /metrics (501), then /slots');
    await bounded(s!.nextScrape(), 'a re-probe');
    const mid = await status(w);
    assert.equal(mid.state, 'draining');
    assert.match(mid.waiting_for.join(' '), /engine \(llamacpp\): 1 slot processing/);
    s!.release();
    await drained(w);
  });

  it('forwards sampling fields and continuations to the engine', { skip: simOnly }, async () => {
    const { w, s } = await fronted('vllm');
    const plain = await gen(w, { temperature: 0.3, seed: 7, stop: ['zzz'], max_tokens: 4 });
    assert.equal(tokensOf(await plain.done).tokens, 4);
    const cont = await gen(w, { prompt: 'go on:', continuation: { text: ' tide river', completion_tokens: 2 }, max_tokens: 2 });
    assert.equal(tokensOf(await cont.done).last.usage.completion_tokens, 2, 'only what this worker generated is counted');
    const [p, k] = s!.seen;
    assert.equal(p?.path, '/v1/completions');
    assert.deepEqual(
      { model: p?.body.model, stream: p?.body.stream, temperature: p?.body.temperature, seed: p?.body.seed, stop: p?.body.stop, max_tokens: p?.body.max_tokens },
      { model: 'sim-model', stream: true, temperature: 0.3, seed: 7, stop: ['zzz'], max_tokens: 4 },
    );
    assert.equal(k?.body.prompt, 'go on: tide river', 'a completion continues from the prompt plus what was generated');
  });

  it('an engine still busy after ebb\'s count reached 0 keeps the worker draining until it is idle (re-probed)', { skip: simOnly }, async () => {
    const { w, s } = await fronted('vllm');
    const st = await gen(w, { max_tokens: 8 });
    await st.first;
    s!.holdBusy(1, 1); // another client's request on engine 1: not ebb's, but the engine is not idle
    const drain = await call('POST', `${w.systemUrl}/engine/drain`);
    assert.equal(drain.body.state, 'draining');
    assert.equal(tokensOf(await st.done).tokens, 8);
    // ebb's own count is 0 now; the drain must wait on the engine, re-probing it.
    await bounded(s!.nextScrape(), 'a probe after the last stream ended');
    await bounded(s!.nextScrape(), 'a re-probe while the engine stays busy');
    const mid = await status(w);
    assert.equal(mid.state, 'draining', 'no drained while the engine reports pending work');
    assert.equal(mid.inflight_requests, 0);
    assert.match(mid.waiting_for.join(' '), /engine \(vllm\): 1 running, 1 queued/);
    const mark = w.mark();
    s!.release();
    await drained(w, mark);
    assert.equal(w.logs.filter((l) => l.event === 'state_changed' && l.to === 'drained').length, 1, 'drained once, only after the engine became idle');
  });

  for (const [mode, why] of [
    ['slow', /did not answer within 1000 ms/],
    ['garbage', /unreadable/],
    ['missing', /vllm:num_requests_running is missing/],
  ] as const) {
    it(`metrics ${mode}: stays draining (fail-closed) and says why, then drains once the metrics are readable`, { skip: simOnly }, async () => {
      const { w, s } = await fronted('vllm');
      s!.metricsMode = mode;
      const drain = await call('POST', `${w.systemUrl}/engine/drain`);
      assert.equal(drain.body.state, 'draining');
      assert.match(drain.body.waiting_for.join(' '), /engine idleness unknown \(fail-closed\)/);
      assert.match(drain.body.waiting_for.join(' '), why);
      await bounded(s!.nextScrape(), 'a re-probe');
      assert.equal((await status(w)).state, 'draining');
      s!.release();
      await drained(w);
    });
  }

  it('generic: stays draining (the engine cannot tell); trust-inflight drains on ebb\'s own count', async () => {
    const { w } = await fronted('generic');
    const drain = await call('POST', `${w.systemUrl}/engine/drain`);
    assert.equal(drain.body.state, 'draining');
    assert.match(drain.body.waiting_for.join(' '), /generic engine cannot report.*--engine-quiescence trust-inflight/);
    const { w: trusting } = await fronted('generic', ['--engine-quiescence', 'trust-inflight']);
    const st = await gen(trusting, real ? {} : { max_tokens: 100 }); // 2 s at the simulator's 20 ms: still running when the drain answers
    await st.first;
    const d = await call('POST', `${trusting.systemUrl}/engine/drain`);
    assert.equal(d.body.state, 'draining');
    assert.equal(d.body.inflight_requests, 1);
    await st.done;
    await drained(trusting);
    assert.equal((await status(w)).state, 'draining', 'the probing generic worker is still draining');
  });

  it('a client that leaves closes the engine request at once', async () => {
    const { w, s } = await fronted('vllm', [], { itlMs: 50 });
    const st = await gen(w, { max_tokens: real ? 1000 : 10_000 });
    const closed = s?.nextClosedEarly();
    await st.first;
    st.abort();
    if (s) {
      await bounded(closed as Promise<void>, 'the engine request to close');
      assert.equal(s.running, 0);
      assert.equal(s.closedEarly, 1);
    }
    const drain = await call('POST', `${w.systemUrl}/engine/drain`);
    if (drain.body.state !== 'drained') await drained(w);
    const after = await status(w);
    assert.equal(after.inflight_requests, 0);
    assert.equal(after.engine.running_sequences, 0);
  });
});

describe('--engine openai: logprobs', { skip: simOnly }, () => {
  /** Both shapes a vLLM answers in (completions' parallel arrays, chat's content list); llama-server answers both in the second. */
  async function passedThrough(kind: 'vllm' | 'llamacpp', top: number): Promise<{ w: WorkerHandle; s: EngineSim }> {
    const { w, s } = await fronted(kind);
    const completion = textLines(await (await gen(w, { max_tokens: 5, logprobs: true, top_logprobs: top })).done);
    const chat = textLines(await (await gen(w, { prompt: 'user: hi', messages: [{ role: 'user', content: 'hi' }], max_tokens: 5, logprobs: true, top_logprobs: top })).done);
    for (const [what, pieces] of [['completions', completion], ['chat', chat]] as const) {
      assert.equal(pieces.length, 5, what);
      pieces.forEach((p, i) => {
        assert.equal(p.logprobs?.length, 1, `${kind} ${what} piece ${i}: one entry per token`);
        assert.equal(p.logprobs![0]!.token, p.text);
        assertTokenLogprob(p.logprobs![0]!, top, `${kind} ${what} piece ${i}`, { ownBytes: what === 'chat' || kind === 'llamacpp' });
        if (top > 0) assert.equal(p.logprobs![0]!.top_logprobs[0]!.token, p.text, `${kind} ${what} piece ${i}: the simulated model's choice is its most likely token`);
      });
    }
    assert.deepEqual(
      completion.map((p) => p.logprobs![0]!.logprob),
      chat.map((p) => p.logprobs![0]!.logprob),
      'the same words, the same values, from either shape',
    );
    return { w, s: s! };
  }

  it('asks vLLM for them and passes its logprobs through, chat and completions', async () => {
    const { w, s } = await passedThrough('vllm', 2);
    const [c, m] = s.seen;
    assert.equal(c?.body.logprobs, 2, 'completions: logprobs N');
    assert.deepEqual({ logprobs: m?.body.logprobs, top_logprobs: m?.body.top_logprobs }, { logprobs: true, top_logprobs: 2 }, 'chat: logprobs true, top_logprobs N');
    const whole = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'tell me about tides', max_tokens: 5, logprobs: true, stream: false });
    assert.equal(whole.status, 200);
    assert.equal(whole.body.logprobs.length, 5, 'collected in a non-streamed answer');
    assert.equal(s.seen.at(-1)?.body.logprobs, 0);
    const plain = await gen(w, { max_tokens: 2 });
    assert.equal(textLines(await plain.done).some((p) => 'logprobs' in p), false, 'not asked: none sent');
    assert.equal('logprobs' in (s.seen.at(-1)?.body ?? {}), false, 'not asked: not asked of the engine');
  });

  it('llama-server: top_logprobs 0 still reports each token\'s logprob (asked for one alternative, cut to none)', async () => {
    const { s } = await passedThrough('llamacpp', 0);
    const [c, m] = s.seen;
    assert.equal(c?.body.logprobs, 1);
    assert.equal(m?.body.top_logprobs, 1);
  });

  it('a generic engine server declares none: the worker refuses logprobs with 400 naming the field', async () => {
    const { w, s } = await fronted('generic');
    const res = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'hello', max_tokens: 2, logprobs: true });
    assert.equal(res.status, 400);
    assert.equal(res.body.error.code, 'unsupported_parameter');
    assert.equal(res.body.error.param, 'logprobs');
    assert.match(res.body.error.message, /engine \(openai\) cannot report logprobs/);
    assert.equal(s!.seen.length, 0, 'nothing reached the engine');
    const off = await call('POST', `${w.requestUrl}/generate`, { model: 'm1', prompt: 'hello', max_tokens: 2, logprobs: false, stream: false });
    assert.equal(off.status, 200, 'logprobs false needs nothing');
  });
});

describe('--engine-cmd: the engine as the worker\'s child', { skip: simOnly }, () => {
  it('starts the engine before the worker is ready, and stops it only after the drain on SIGTERM', async () => {
    const w = await worker(['--engine-cmd', simCmd('--kind vllm --itl-ms 20 --load-ms 400'), '--engine-kind', 'vllm', '--shutdown-grace-ms', '0']);
    const enginePid = w.logs.find((l) => l.event === 'engine_started')?.pid as number;
    assert.ok(enginePid > 0 && alive(enginePid));
    const st = await gen(w, { max_tokens: 25 });
    await st.first;
    w.signal('SIGTERM');
    assert.equal(tokensOf(await st.done).tokens, 25, 'the stream finishes on the engine before it is stopped');
    assert.equal(await w.exitCode(), 0);
    const at = (pred: (l: LogLine) => boolean) => w.logs.findIndex(pred);
    const order = [
      at((l) => l.event === 'engine_started'),
      at((l) => l.event === 'engine_ready'),
      at((l) => l.event === 'worker_ready'),
      at((l) => l.event === 'shutdown_started'),
      at((l) => l.event === 'shutdown_stage' && l.stage === 'wait_inflight' && l.outcome === 'completed'),
      at((l) => l.event === 'engine_stopping'),
      at((l) => l.event === 'engine_stopped'),
    ];
    // shutdown_complete is not ordered against engine_stopped here: both are written in the last
    // millisecond before exit, and pino's asynchronous write can land after its exit flush.
    assert.ok(w.logs.some((l) => l.event === 'shutdown_complete' && l.exit_code === 0));
    assert.ok(order.every((i, n) => i >= 0 && (n === 0 || i > (order[n - 1] as number))), `log order: ${order.join(' < ')}`);
    assert.ok(!alive(enginePid), 'the engine process is gone');
    assert.ok(w.stderr.some((l) => l.startsWith(`[engine ${enginePid}] engine-sim: SIGTERM received`)), 'engine output reaches the worker\'s stderr, prefixed');
    assert.equal(w.logs.find((l) => l.event === 'engine_stopped')?.forced, false);
  });

  it('an engine that ignores SIGTERM is killed after --engine-stop-timeout-ms', async () => {
    const w = await worker(['--engine-cmd', simCmd('--kind vllm --ignore-sigterm'), '--engine-kind', 'vllm', '--engine-stop-timeout-ms', '300', '--shutdown-grace-ms', '0']);
    const enginePid = w.logs.find((l) => l.event === 'engine_started')?.pid as number;
    w.signal('SIGTERM');
    await w.exitCode();
    const stopped = w.logs.find((l) => l.event === 'engine_stopped');
    assert.equal(stopped?.forced, true);
    assert.equal(stopped?.signal, 'SIGKILL');
    assert.ok(w.logs.some((l) => l.event === 'engine_stop_forced'));
    assert.ok(!alive(enginePid));
  });

  it('while the engine loads: /health says loading, not registered; SIGTERM stops the engine child', async () => {
    const url = tempDiscoveryUrl();
    const p = spawnEbb(['worker', '--port', '0', '--system-port', '0', '--discovery', url, '--model', 'm1', '--engine', 'openai', '--engine-kind', 'vllm', '--engine-cmd', simCmd('--kind vllm --load-ms 60000')], 'worker');
    const loading = await p.waitForEvent('worker_loading');
    const enginePid = (await p.waitForEvent('engine_started')).pid as number;
    const health = await call('GET', `${loading.system_url as string}/health`);
    assert.equal(health.status, 503);
    assert.match(JSON.stringify(health.body), /loading/);
    p.signal('SIGTERM');
    assert.equal(await p.exitCode(), 0);
    assert.ok(p.logs.some((l) => l.event === 'engine_stopped'), 'the worker stopped its engine');
    assert.ok(!alive(enginePid));
    assert.ok(!p.logs.some((l) => l.event === 'worker_ready'));
  });
  it('an engine that dies takes the worker out of discovery and the worker exits non-zero', async () => {
    const w = await worker(['--engine-cmd', simCmd('--kind vllm'), '--engine-kind', 'vllm']);
    const enginePid = w.logs.find((l) => l.event === 'engine_started')?.pid as number;
    const record = join(w.discoveryDir, `${w.workerId}.json`);
    assert.ok(existsSync(record));
    process.kill(enginePid, 'SIGKILL');
    assert.notEqual(await w.exitCode(), 0);
    assert.ok(!existsSync(record), 'the worker left discovery');
  });
});

describe('OpenAIEngine in this process', { skip: simOnly }, () => {
  const spec = (options: Record<string, unknown>) => ({ kind: 'openai' as const, options: { kind: 'vllm' as EngineKind, quiescence: 'probe' as const, stopTimeoutMs: 2000, loadTimeoutMs: 10_000, ...options } });

  it('reports an engine child that exits on its own through onFailure, and not one that close() stopped', async () => {
    const { log, next } = captureLog();
    const engine = await createEngine(spec({ command: simCmd('--kind vllm') }), 'aggregated', log, new AbortController().signal);
    engines.push(engine);
    const failure = new Promise<Error>((resolve) => engine.onFailure?.(resolve));
    const pid = (await next('engine_started')).pid as number;
    process.kill(pid, 'SIGKILL');
    const err = await bounded(failure, 'onFailure');
    assert.match(err.message, /the engine exited on its own \(SIGKILL\)/);
    const q = await engine.probeQuiescence();
    assert.equal(q.state, 'unknown', 'a dead engine is never idle');

    const calm = captureLog();
    const other = await createEngine(spec({ command: simCmd('--kind vllm') }), 'aggregated', calm.log, new AbortController().signal);
    let failed = false;
    other.onFailure?.(() => (failed = true));
    await other.close();
    assert.ok(calm.lines.some((l) => l.event === 'engine_stopped'));
    assert.equal(failed, false, 'a stop ebb asked for is not a failure');
  });

  it('SIGTERM while the engine loads (the abort signal) stops the child and rejects with one line', async () => {
    const { log, next } = captureLog();
    const abort = new AbortController();
    const starting = createEngine(spec({ command: simCmd('--kind vllm --load-ms 60000') }), 'aggregated', log, abort.signal);
    const pid = (await next('engine_started')).pid as number;
    abort.abort();
    await assert.rejects(starting, (err: Error) => /cancelled while waiting for http:\/\/127\.0\.0\.1:\d+\/health/.test(err.message) && !err.message.includes('\n'));
    assert.ok(!alive(pid), 'the loading engine was stopped');
  });

  it('sends chat requests (messages) to /v1/chat/completions, a continuation as an assistant prefix', async () => {
    const s = await sim('vllm');
    const engine = await createEngine(spec({ url: s.url }), 'aggregated', captureLog().log, new AbortController().signal);
    engines.push(engine);
    const run = async (req: Partial<GenerateRequest>) => {
      const it = engine.generate({ request_id: 'r', prompt: 'user: hi there', messages: [{ role: 'user', content: 'hi there' }], max_tokens: 3, temperature: 0, ...req }, new AbortController().signal);
      let text = '';
      for (;;) {
        const step = await it.next();
        if (step.done) return { text, result: step.value };
        text += step.value.text;
      }
    };
    const passThrough: Record<string, unknown> = { top_p: 0.9, response_format: { type: 'json_object' } };
    const chat = await run(passThrough as Partial<GenerateRequest>);
    assert.equal(chat.result.completion_tokens, 3);
    assert.equal(chat.result.prompt_tokens, 2, 'usage comes from the engine');
    assert.equal(chat.text.split(' ').length, 3);
    await run({ continuation: { text: 'tide', completion_tokens: 1 }, max_tokens: 2 });
    const [c, kc] = s.seen;
    assert.equal(c?.path, '/v1/chat/completions');
    assert.deepEqual(c?.body.messages, [{ role: 'user', content: 'hi there' }]);
    assert.equal(c?.body.top_p, 0.9);
    assert.deepEqual(c?.body.response_format, { type: 'json_object' });
    assert.equal(c?.body.max_tokens, 3);
    assert.deepEqual(kc?.body.messages.at(-1), { role: 'assistant', content: 'tide' });
    assert.equal(kc?.body.continue_final_message, true);
    assert.equal(kc?.body.add_generation_prompt, false);
  });

  it('counts pieces when the engine does not report usage', async () => {
    const s = await sim('llamacpp', { usage: false });
    const engine = await createEngine(spec({ url: s.url, kind: 'llamacpp' }), 'aggregated', captureLog().log, new AbortController().signal);
    engines.push(engine);
    const it = engine.generate({ request_id: 'r', prompt: 'hello', max_tokens: 5, temperature: 0 }, new AbortController().signal);
    let step = await it.next();
    while (!step.done) step = await it.next();
    assert.deepEqual(step.value, { finish_reason: 'length', prompt_tokens: 0, completion_tokens: 5 });
  });

  it('a remote engine that went away: idleness unknown (fail-closed), generate fails with the cause', async () => {
    const s = await sim('sglang');
    const engine = await createEngine(spec({ url: s.url, kind: 'sglang' }), 'aggregated', captureLog().log, new AbortController().signal);
    engines.push(engine);
    assert.deepEqual(await engine.probeQuiescence(), { state: 'idle' });
    s.die();
    const q = await engine.probeQuiescence();
    assert.equal(q.state, 'unknown');
    assert.match((q as { reason: string }).reason, /sglang metrics: .*(ECONNREFUSED|UND_ERR_SOCKET)/);
    const it = engine.generate({ request_id: 'r', prompt: 'hello', max_tokens: 5, temperature: 0 }, new AbortController().signal);
    await assert.rejects(it.next(), /ECONNREFUSED|other side closed/);
  });

  it('takes max_context from /v1/models max_model_len, else null; declares json_object and continuation per kind', async () => {
    const withLen = await sim('vllm', { maxModelLen: 8192 });
    const e1 = await createEngine(spec({ url: withLen.url }), 'aggregated', captureLog().log, new AbortController().signal);
    engines.push(e1);
    assert.deepEqual(e1.capabilities, { json_object: true, json_schema: false, logprobs: true, tools: false, max_context: 8192, continuation: true, prompt_token_ids: true, embeddings: false, sampling: true });
    const generic = await sim('generic', { maxModelLen: null });
    const e2 = await createEngine(spec({ url: generic.url, kind: 'generic' }), 'aggregated', captureLog().log, new AbortController().signal);
    engines.push(e2);
    assert.equal(e2.capabilities.max_context, null);
    assert.equal(e2.capabilities.json_object, false);
    assert.equal(e2.capabilities.continuation, false);
    assert.equal(e2.capabilities.logprobs, false, 'a generic server may not report logprobs');
  });

  it('an engine that never becomes healthy fails start-up with one line naming the URL', async () => {
    const closed = await freePort(); // nothing listens there (not a fixed port someone may use)
    const p = spawnEbb(['worker', '--engine', 'openai', '--engine-url', `http://127.0.0.1:${closed}`, '--engine-load-timeout-ms', '300', '--discovery', tempDiscoveryUrl()], 'worker');
    assert.equal(await p.exitCode(), 1);
    const line = p.stderr.find((l) => l.startsWith('ebb: '));
    // (The worker may say "worker could not start: " first.)
    assert.match(line ?? '', new RegExp(`^ebb: .*the engine at http://127\\.0\\.0\\.1:${closed}/v1/models did not become healthy within 300 ms \\(last: .*ECONNREFUSED`));
  });
});
