/**
 * Sampling parameters reach every engine (issue 44 item 1): frequency_penalty, presence_penalty,
 * logit_bias, and vLLM's repetition_penalty, top_k and min_p are carried by the frontend to workers
 * whose engine declares `sampling`: the mocker gives each a deterministic, visible effect,
 * `--engine openai` passes them to the engine server (as llama-server names them), and a model whose
 * workers cannot honour them refuses them naming the field. A stream continued on another worker
 * samples as it would have on one. (llama-cpp: llama-cpp.test.ts.)
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { call, fakeWorker, injectRecord, type FakeWorker } from './helpers/http.js';
import { startEngineSim, type EngineSim } from './helpers/engine-sim.js';
import { streamCompletion } from './helpers/sse.js';
import { spawnWorker, startFrontend, tempDiscoveryUrl, workerReady, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';
import { mockerTokenIds } from '../src/protocol/mocker-tokenizer.js';

const started: EbbProcess[] = [];
let frontend: FrontendHandle;
let mockers: WorkerHandle[];
let vllm: EngineSim;
let llamaServer: EngineSim;
let old: FakeWorker;

before(async () => {
  const discovery = tempDiscoveryUrl();
  [vllm, llamaServer] = await Promise.all([startEngineSim({ kind: 'vllm', itlMs: 0, usage: true }), startEngineSim({ kind: 'llamacpp', itlMs: 0, usage: true })]);
  const spawned = [
    spawnWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '15', '--mocker-ttft-ms', '0']),
    spawnWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '15', '--mocker-ttft-ms', '0']),
    spawnWorker(['--discovery', discovery, '--model', 'vllm-m', '--engine', 'openai', '--engine-kind', 'vllm', '--engine-url', vllm.url]),
    spawnWorker(['--discovery', discovery, '--model', 'llama-server-m', '--engine', 'openai', '--engine-kind', 'llamacpp', '--engine-url', llamaServer.url]),
  ];
  started.push(...spawned);
  const ready = await Promise.all(spawned.map(workerReady));
  mockers = ready.slice(0, 2);
  // A worker of an older ebb: its record declares no `sampling` (it would refuse the fields as unknown).
  old = await fakeWorker((_req, res) => res.writeHead(500).end());
  injectRecord(discovery, { worker_id: 'w-old', model: 'old', request_url: old.url, system_url: old.url, engine: 'mocker', capabilities: { max_context: null } });
  frontend = await startFrontend(discovery);
  started.push(frontend);
  await frontend.waitForEvent('discovery_reset', (l) => (l.workers as string[]).length === 5);
});
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
  await vllm?.close();
  await llamaServer?.close();
  await old?.close();
});

const client = () => new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'unused', maxRetries: 0 });
/** The mocker's token id of one of its words (one token per word: protocol/mocker-tokenizer.ts). */
const idOf = (word: string) => String(mockerTokenIds(word)[0]);
const PENALTIES = { frequency_penalty: 1.5, presence_penalty: 0.5, logit_bias: { [idOf('tide')]: 3, [idOf('the')]: -100 } };
const words = (text: string) => text.trim().split(/\s+/);
/** Words written more than once. */
const repeats = (text: string) => words(text).length - new Set(words(text)).size;

describe('sampling parameters', () => {
  it('the mocker through the openai SDK: chat, completions and Responses with penalties and logit_bias answer 200, at temperature 0 another text than without them, the same each time', async () => {
    const c = client();
    const chat = (extra: object) =>
      c.chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'tell me about the sea' }], max_tokens: 40, temperature: 0, ...extra }).then((r) => r.choices[0]!.message.content ?? '');
    const plain = await chat({});
    const penalised = await chat(PENALTIES);
    assert.notEqual(penalised, plain);
    assert.equal(await chat(PENALTIES), penalised, 'deterministic');
    assert.ok(!words(penalised).includes('the') && words(plain).includes('the'), `logit_bias -100 bans "the": ${penalised}`);

    const completion = (extra: object) => c.completions.create({ model: 'm1', prompt: 'the tide', max_tokens: 40, temperature: 0, ...extra }).then((r) => r.choices[0]!.text);
    assert.notEqual(await completion(PENALTIES), await completion({}));

    // Not Responses fields in OpenAI's types: sent as a client's extra body is.
    const responses = (extra: object) => c.responses.create({ model: 'm1', input: 'tell me about the sea', max_output_tokens: 40, temperature: 0, ...extra } as OpenAI.Responses.ResponseCreateParamsNonStreaming).then((r) => r.output_text);
    assert.notEqual(await responses(PENALTIES), await responses({}));
  });

  it('each field has its visible effect on the mocker', async () => {
    const answer = async (extra: object) => {
      const res = await call('POST', `${frontend.url}/v1/completions`, { model: 'm1', prompt: 'a long story', max_tokens: 64, seed: 3, ...extra });
      assert.equal(res.status, 200, JSON.stringify(res.body));
      return res.body.choices[0].text as string;
    };
    const plain = await answer({});
    assert.ok(repeats(plain) > 0, `a 64-word answer of the mocker's 75 words repeats some: ${plain}`);
    assert.deepEqual(new Set(words(await answer({ logit_bias: { [idOf('harbor')]: 100 } }))), new Set(['harbor']), 'logit_bias 100: only that word');
    assert.ok(repeats(await answer({ frequency_penalty: 2 })) < repeats(plain), 'frequency_penalty: fewer repeats');
    assert.ok(repeats(await answer({ presence_penalty: 2 })) < repeats(plain), 'presence_penalty: fewer repeats');
    assert.ok(repeats(await answer({ repetition_penalty: 2 })) < repeats(plain), 'repetition_penalty: fewer repeats');
    assert.equal(new Set(words(await answer({ top_k: 3, logit_bias: { [idOf('tide')]: 1, [idOf('river')]: 1, [idOf('shore')]: 1 } }))).size <= 3, true, 'top_k 3: three words at most');
    assert.deepEqual(new Set(words(await answer({ min_p: 0.9, logit_bias: { [idOf('light')]: 5 } }))), new Set(['light']), 'min_p: only the likeliest');
    // A token id past the mocker's tokenizer is no token: refused naming the field.
    const bad = await call('POST', `${frontend.url}/v1/completions`, { model: 'm1', prompt: 'x', max_tokens: 2, logit_bias: { '9999999999': 1 } });
    assert.deepEqual([bad.status, bad.body.error.param], [400, 'logit_bias']);
  });

  it('a stream continued on another worker (its worker SIGKILLed) samples as one worker would: the text of an undisturbed run', async () => {
    const body = { model: 'm1', max_tokens: 60, seed: 5, ...PENALTIES };
    const undisturbed = await streamCompletion(frontend.url, body);
    assert.equal(undisturbed.tokens, 60, undisturbed.error);
    let killed = false;
    const moved = await streamCompletion(frontend.url, body, undefined, (n, seen) => {
      if (n !== 20 || killed) return;
      killed = true;
      mockers.find((w) => w.workerId === seen.workerId)!.signal('SIGKILL');
    });
    assert.ok(killed, 'the serving worker was killed mid-stream');
    assert.equal(moved.error, undefined);
    assert.equal(moved.text, undisturbed.text);
  });

  it('--engine openai passes every field to the engine server (vLLM by its names, llama-server with repeat_penalty)', async () => {
    const fields = { frequency_penalty: 0.5, presence_penalty: -0.5, repetition_penalty: 1.2, logit_bias: { '42': 7 }, top_k: 20, min_p: 0.05 };
    for (const [model, sim] of [['vllm-m', vllm], ['llama-server-m', llamaServer]] as const) {
      const before = sim.seen.length;
      const res = await client().chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 3, ...fields } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
      assert.equal(res.choices.length, 1);
      const sent = sim.seen.slice(before).find((r) => r.path === '/v1/chat/completions')!.body;
      const { repetition_penalty, ...same } = fields;
      for (const [k, v] of Object.entries(same)) assert.deepEqual(sent[k], v, `${model}: ${k}`);
      assert.equal(sent[model === 'vllm-m' ? 'repetition_penalty' : 'repeat_penalty'], repetition_penalty, model);
    }
    // Fields at their defaults change nothing and are not sent.
    const before = vllm.seen.length;
    await client().chat.completions.create({ model: 'vllm-m', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2, frequency_penalty: 0, logit_bias: {} });
    const sent = vllm.seen.slice(before).find((r) => r.path === '/v1/chat/completions')!.body;
    assert.ok(!('frequency_penalty' in sent) && !('logit_bias' in sent), JSON.stringify(sent));
  });

  it('a model whose workers do not declare `sampling` refuses a field that needs it, naming it, and never sends it there', async () => {
    const refused = await call('POST', `${frontend.url}/v1/chat/completions`, { model: 'old', messages: [{ role: 'user', content: 'x' }], presence_penalty: 1 });
    assert.equal(refused.status, 400);
    assert.deepEqual([refused.body.error.code, refused.body.error.param], ['unsupported_parameter', 'presence_penalty']);
    assert.equal(old.seen.length, 0, 'never sent to the worker');
  });
});
