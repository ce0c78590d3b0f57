/**
 * LoRA adapters on the llama-cpp engine (issue 37), in-process against a real llama.cpp and the
 * tiny model with two tiny adapters: which adapter answered, resident slots, bad files refused.
 * One engine for the whole file (a model load is slow on a loaded machine); few tokens. One case
 * runs the same adapters in a worker process behind a frontend, the in-process engine its reference.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { InvalidArgumentError } from 'commander';
import OpenAI from 'openai';
import { loadLlamaCppEngine, type LlamaCppEngine, type LlamaCppOptions } from '../src/engine/llama-cpp.js';
import type { GenerateRequest } from '../src/engine/engine.js';
import type { KvTransfer } from '../src/engine/kv-transfers.js';
import { EbbError } from '../src/protocol/errors.js';
import { createLogger } from '../src/common/logger.js';
import { collectLoraFlag, parseLoraFlag } from '../src/cli/lora-flag.js';
import { writeTinyLlamaGguf, writeTinyLoraGguf } from './helpers/gguf.js';
import { call } from './helpers/http.js';
import { drainGeneration } from './helpers/generation.js';
import { spawnEbb, startFrontend, frontendSeesWorkers, tempDiscoveryUrl, workerReady, type EbbProcess } from './helpers/processes.js';

const modelPath = writeTinyLlamaGguf();
const loraA = writeTinyLoraGguf({ seed: 1 });
const loraB = writeTinyLoraGguf({ seed: 2 });
/** Longer than a KV block (16 tokens): a reused prefix shows as cached tokens. */
const PROMPT = 'hello world, tell me about the tides and the river and the harbor light';

const live = () => new AbortController().signal;
const request = (adapter?: string, extra: Partial<GenerateRequest> = {}): GenerateRequest =>
  ({ request_id: 'r', prompt: PROMPT, max_tokens: 12, temperature: 0, adapter, ...extra }) as GenerateRequest;

/** Refused with this catalogue code, the message saying `why`. */
async function refused(p: Promise<unknown>, code: string, why: RegExp): Promise<void> {
  await assert.rejects(p, (err: unknown) => {
    assert.ok(err instanceof EbbError, `an EbbError, not ${String(err)}`);
    assert.equal(err.code, code, err.message);
    assert.match(err.message, why);
    return true;
  });
}

describe('llama-cpp engine with LoRA adapters', () => {
  let engine: LlamaCppEngine;
  const options: LlamaCppOptions = {
    modelPath,
    parallel: 2,
    maxQueue: 4,
    contextSize: 256,
    threads: 1,
    gpu: 'off',
    loras: [
      { name: 'a', path: loraA },
      { name: 'b', path: loraB },
    ],
    loraSlots: 2,
  };
  before(async () => {
    engine = await loadLlamaCppEngine(options, createLogger('test'), live());
  });
  after(async () => {
    await engine?.close();
  });
  const answer = async (adapter?: string) => (await drainGeneration(engine.generate(request(adapter), live()))).text;

  it('at temperature 0 two adapters answer differently from each other and from the base; run together, each as alone', async () => {
    assert.deepEqual(engine.adapters.available(), options.loras);
    assert.deepEqual(await engine.adapters.resident(), [], 'nothing is loaded before the worker asks');
    const base = await answer();
    await engine.adapters.load({ name: 'a' }, live());
    await engine.adapters.load({ name: 'b' }, live());
    assert.deepEqual((await engine.adapters.resident()).sort(), ['a', 'b']);
    assert.deepEqual(engine.stats().lora_resident, ['a', 'b']);
    const a = await answer('a');
    const b = await answer('b');
    assert.equal(new Set([base, a, b]).size, 3, `three answers: base ${JSON.stringify(base)}, a ${JSON.stringify(a)}, b ${JSON.stringify(b)}`);
    // Each adapter's context decodes on its own: neither answer is touched by the other's.
    const [a2, b2, base2] = await Promise.all([answer('a'), answer('b'), answer()]);
    assert.deepEqual([a2, b2, base2], [a, b, base]);
  });

  it('a llama-cpp worker process behind a frontend: the openai SDK gets the engine\'s three answers by name; /v1/models lists a and b under the base', async () => {
    const discovery = tempDiscoveryUrl();
    const procs: EbbProcess[] = [];
    try {
      const worker = spawnEbb(
        ['worker', '--port', '0', '--system-port', '0', '--discovery', discovery, '--engine', 'llama-cpp', '--model-path', modelPath, '--model', 'tiny', '--threads', '1', '--gpu', 'off',
          '--parallel', '2', '--context-size', '256', '--lora', `a=${loraA}`, '--lora', `b=${loraB}`, '--lora-slots', '2', '--lora-dir', '/nonexistent'],
        'worker',
      );
      procs.push(worker);
      const { systemUrl } = await workerReady(worker);
      const frontend = await startFrontend(discovery);
      procs.push(frontend);
      await frontendSeesWorkers(frontend, 1);
      const client = new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'unused', maxRetries: 0 });
      const models = (await client.models.list()).data as Array<OpenAI.Model & { parent?: string }>;
      assert.deepEqual(models.map((m) => [m.id, m.parent ?? null]), [['tiny', null], ['a', 'tiny'], ['b', 'tiny']]);

      const ask = async (model: string) => (await client.completions.create({ model, prompt: PROMPT, max_tokens: 12, temperature: 0 })).choices[0]?.text;
      const served = { base: await ask('tiny'), a: await ask('a'), b: await ask('b') };
      assert.equal(new Set(Object.values(served)).size, 3, `three answers through the frontend: ${JSON.stringify(served)}`);
      assert.deepEqual(served, { base: await answer(), a: await answer('a'), b: await answer('b') }, "each is the in-process engine's answer");
      assert.deepEqual({ a: await ask('a'), b: await ask('b') }, { a: served.a, b: served.b }, 'asked again, each adapter answers alike');

      // An admin load reads nothing outside the adapters' own paths and --lora-dir.
      const outside = await call('POST', `${systemUrl}/engine/adapters/c/load`, { path: '/etc/passwd' });
      assert.equal(outside.status, 403, JSON.stringify(outside.body));
      assert.match(outside.body.error.message, /may not be loaded from \/etc\/passwd: a load reads only the adapter's own path \(its --lora\) or one under --lora-dir \(\/nonexistent\)/);
      // One under --lora-dir that is no adapter fails, and the name is not offered to clients.
      const bad = await call('POST', `${systemUrl}/engine/adapters/c/load`, { path: '/nonexistent/lora.gguf' });
      assert.equal(bad.status, 502);
      assert.equal(bad.body.error.code, 'adapter_load_failed');
      assert.match(bad.body.error.message, /cannot load LoRA adapter "c" from \/nonexistent\/lora\.gguf: no such file/);
      const names = (await call('GET', `${systemUrl}/engine/status`)).body.adapters.map((x: { name: string }) => x.name);
      assert.deepEqual(names, ['a', 'b'], 'c is not among the adapters the worker (and its record) offers');
    } finally {
      await Promise.all(procs.map((p) => p.stop()));
    }
  });

  it("a prompt's KV is reused under the adapter that computed it, never under another or the base", async () => {
    const prompt = 'quiet steady river, the shore and the harbor light, tell me about the flow of the tide';
    const run = async (adapter?: string) => (await drainGeneration(engine.generate(request(adapter, { prompt }), live()))).result.cached_tokens;
    assert.equal(await run(), 0, 'a new prompt');
    assert.equal(await run('a'), 0, "the base model's KV of the same prompt is not reused under adapter a");
    assert.equal(await run('b'), 0, 'nor under adapter b');
    assert.ok(((await run('a')) ?? 0) >= 16, "adapter a's own KV of it is reused");
  });

  it('unload frees the slot: resident() before and after, and a reload answers as before', async () => {
    const before = await answer('a');
    await engine.adapters.unload('a');
    assert.deepEqual(await engine.adapters.resident(), ['b']);
    assert.deepEqual(engine.stats().lora_resident, ['b']);
    await refused(answer('a'), 'model_not_found', /"a" is not resident/);
    await engine.adapters.load({ name: 'a' }, live());
    assert.equal(await answer('a'), before, 'the adapter read again from its file');
  });

  it('loading past --lora-slots is refused: one must be unloaded first', async () => {
    const c = writeTinyLoraGguf({ seed: 3 });
    await refused(engine.adapters.load({ name: 'c', path: c }, live()), 'adapter_slots_busy', /all 2 LoRA adapter slots are taken \((a, b|b, a)\)/);
    assert.deepEqual((await engine.adapters.resident()).sort(), ['a', 'b']);
    await engine.adapters.unload('b');
    await engine.adapters.load({ name: 'c', path: c }, live());
    assert.deepEqual((await engine.adapters.resident()).sort(), ['a', 'c']);
    assert.ok(engine.adapters.available().some((s) => s.name === 'c' && s.path === c), 'an adapter loaded at run time is available from then on');
    await engine.adapters.unload('c');
  });

  it('a file that is not a LoRA adapter for this model is refused, saying why; nothing is loaded', async () => {
    const garbage = `${writeTinyLlamaGguf()}.txt`;
    writeFileSync(garbage, 'not a model at all, just some text that is long enough');
    const cases: Array<[string, RegExp]> = [
      [modelPath, /not a LoRA adapter \(general.type is null, not "adapter"\)/],
      [writeTinyLoraGguf({ base: { embedding: 32 } }), /blk\.0\.attn_q\.weight pair is \[32, 4\] x \[4, 32\]; the model's blk\.0\.attn_q\.weight is \[64, 64\]/],
      [writeTinyLoraGguf({ architecture: 'qwen2' }), /an adapter for architecture "qwen2"; the model is llama/],
      [garbage, /not a GGUF file/],
      ['/nonexistent/lora.gguf', /no such file/],
    ];
    for (const [path, why] of cases) await refused(engine.adapters.load({ name: 'bad', path }, live()), 'invalid_request', why);
    await refused(engine.adapters.load({ name: 'nameless' }, live()), 'not_found', /no LoRA adapter "nameless"/);
    assert.deepEqual(await engine.adapters.resident(), ['a']);
    assert.ok(!engine.adapters.available().some((s) => s.name === 'bad'), 'a refused file is not made available');
  });

  it("an adapter's KV does not move: a prefill under one is refused, a pulled state is not loaded under one, a hand-off exports none", async () => {
    await refused(engine.prefill(request('a'), live()), 'unsupported_parameter', /does not move an adapter's KV/);
    const prompt = 'tell me about the worker and the fleet, the engine and the drain of the stream';
    const t = await engine.prefill(request(undefined, { prompt }), live());
    const payload = engine.kvPayload(t.transfer_id);
    assert.ok(payload, 'the base model prefilled the prompt');
    const bytes = readFileSync(payload.path);
    const handle = await engine.importKv(payload.header, payload.bytes, (async function* () { yield bytes; })(), live());
    engine.kvTransfers.complete(t.transfer_id);
    const pulled = await drainGeneration(engine.generate(request('a', { prompt, kv_state: handle }), live()));
    assert.equal(pulled.result.cached_tokens, 0, "the base model's state was not loaded into adapter a's sequence");
    assert.equal(existsSync(handle.path), false, 'the pulled file is gone all the same');
    assert.equal(pulled.text, (await drainGeneration(engine.generate(request('a', { prompt }), live()))).text, "adapter a's own answer");

    // A hand-off at a drain deadline: the base model's sequence is exported, adapter a's is not.
    const handedOff = async (adapter?: string) => {
      const cut = new AbortController();
      let transfer: KvTransfer | undefined;
      const kv_handoff = { wanted: () => true, exported: (t: KvTransfer) => (transfer = t) };
      const g = engine.generate(request(adapter, { prompt, max_tokens: 64, kv_handoff }), cut.signal);
      await g.next();
      cut.abort(new Error('drain deadline'));
      await assert.rejects(drainGeneration(g));
      if (transfer !== undefined) engine.kvTransfers.complete(transfer.transfer_id);
      return transfer;
    };
    assert.ok(await handedOff(), 'the base model hands its sequence on');
    assert.equal(await handedOff('a'), undefined, "adapter a's sequence is not handed on");
  });

  it('a continuation under an adapter goes on as the undisturbed answer', async () => {
    const whole = await drainGeneration(engine.generate(request('a', { max_tokens: 16 }), live()));
    const sent = whole.pieces.slice(0, 3);
    const ids = sent.flatMap((p) => p.token_ids ?? []);
    const continuation = { text: sent.map((p) => p.text).join(''), completion_tokens: ids.length, token_ids: ids };
    const rest = await drainGeneration(engine.generate(request('a', { max_tokens: 16 - ids.length, continuation }), live()));
    assert.equal(continuation.text + rest.text, whole.text);
  });
});

describe('--lora NAME=PATH', () => {
  it('a file named at start that is not an adapter for the model stops the engine from starting, saying which', async () => {
    const options: LlamaCppOptions = { modelPath, parallel: 1, maxQueue: 1, contextSize: 64, threads: 1, gpu: 'off', loras: [{ name: 'sql', path: modelPath }] };
    await assert.rejects(loadLlamaCppEngine(options, createLogger('test'), live()), (err: Error) => {
      assert.match(err.message, /--lora sql=.*tiny-llama\.gguf: not a LoRA adapter/);
      return true;
    });
  });

  it('parses a name and a path; refuses what is not NAME=PATH, a name clients cannot send, and a name given twice', () => {
    assert.deepEqual(parseLoraFlag('sql-v2=/models/sql.gguf'), { name: 'sql-v2', path: '/models/sql.gguf' });
    assert.deepEqual(parseLoraFlag('a=b=c.gguf'), { name: 'a', path: 'b=c.gguf' }, 'the first = splits');
    assert.throws(() => parseLoraFlag('/models/sql.gguf'), (e: unknown) => e instanceof InvalidArgumentError && /expected NAME=PATH/.test(e.message));
    assert.throws(() => parseLoraFlag('my adapter=x.gguf'), /adapter name "my adapter"/);
    assert.throws(() => parseLoraFlag('org/sql=x.gguf'), /adapter name "org\/sql"/);
    assert.throws(() => parseLoraFlag('sql='), /adapter "sql" has no file/);
    assert.throws(() => collectLoraFlag('a=y.gguf', collectLoraFlag('a=x.gguf')), /named by two --lora flags/);
  });
});
