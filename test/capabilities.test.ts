import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { call, fakeWorker, injectRecord } from './helpers/http.js';
import { startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';

const started: EbbProcess[] = [];
const fakes: Array<{ close(): Promise<void> }> = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
  await Promise.all(fakes.map((f) => f.close()));
});

const chat = (extra: Record<string, unknown>) => ({ model: 'm1', max_tokens: 3, messages: [{ role: 'user', content: 'hi' }], ...extra });

/** A worker that answers every request with the text "{}" (a JSON object, so a json_object request's answer parses). */
async function answeringFake() {
  const fake = await fakeWorker((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/x-ndjson' });
    res.end('{"text":"{}"}\n{"done":true,"finish_reason":"stop","usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}\n');
  });
  fakes.push(fake);
  return fake;
}

/** The capabilities of an engine that declares none (an older worker's record has none of the later ones). */
const NONE = { json_object: false, json_schema: false, logprobs: false, tools: false, max_context: 4096, continuation: false };

/**
 * One mocker worker (model m1) and a worker of model m2 whose engine declares nothing, behind one
 * frontend, shared by the first two tests (neither changes it).
 */
let mockerFleet: Promise<{ w: WorkerHandle; frontend: FrontendHandle }> | undefined;
function mockerOnly() {
  return (mockerFleet ??= (async () => {
    const discovery = tempDiscoveryUrl();
    const w = await startWorker(['--discovery', discovery, '--model', 'm1']);
    started.push(w);
    const plain = await answeringFake();
    injectRecord(discovery, { worker_id: 'w-none', model: 'm2', request_url: plain.url, system_url: plain.url, engine: 'fake', capabilities: NONE });
    const frontend = await startFrontend(discovery);
    started.push(frontend);
    await frontend.waitForEvent('discovery_reset', (l) => (l.workers as string[]).length === 2);
    return { w, frontend };
  })());
}

describe('engine capabilities: what the fleet can honour', () => {
  it('publishes the engine and its capabilities in the discovery record', async () => {
    const { w, frontend } = await mockerOnly();
    const adminUrl = (await frontend.waitForEvent('frontend_ready')).admin_url as string;
    const entry = (await call('GET', `${adminUrl}/workers/${w.workerId}`)).body;
    assert.equal(entry.engine, 'mocker');
    assert.deepEqual(entry.capabilities, {
      json_object: true,
      json_schema: true,
      logprobs: true,
      tools: true,
      tool_syntax: { prefix: '<tool_call>\n{"name": "', params_prefix: '", "arguments": ', suffix: '}\n</tool_call>' },
      max_context: 1024,
      continuation: true,
      prompt_token_ids: true,
      embeddings: true,
      sampling: true,
      preemption: true,
    });
  });

  it('answers 400 unsupported_parameter naming the field when no worker of the model can honour it; never drops it silently', async () => {
    const { frontend } = await mockerOnly();
    // /v1/models says what the model's workers can do: the mocker, everything a client can ask for.
    const listed = (await call('GET', `${frontend.url}/v1/models/m1`)).body;
    assert.deepEqual(listed.engines, ['mocker']);
    assert.deepEqual(listed.capabilities, ['json_object', 'json_schema', 'logprobs', 'tools', 'prompt_token_ids', 'embeddings', 'sampling']);
    assert.deepEqual((await call('GET', `${frontend.url}/v1/models/m2`)).body.capabilities, []);
    const url = `${frontend.url}/v1/chat/completions`;
    const m2 = (extra: Record<string, unknown>) => ({ ...chat(extra), model: 'm2' });
    const json = await call('POST', url, m2({ response_format: { type: 'json_object' } }));
    assert.equal(json.status, 400);
    assert.equal(json.body.error.code, 'unsupported_parameter');
    assert.equal(json.body.error.param, 'response_format');
    assert.match(json.body.error.message, /json_object is not supported by any worker of model "m2" \(engines: fake\)/);
    for (const [field, value] of [['presence_penalty', 0.5], ['logit_bias', { '1': 5 }], ['top_k', 4]] as const) {
      const res = await call('POST', url, m2({ [field]: value }));
      assert.equal(res.status, 400, field);
      assert.equal(res.body.error.param, field);
    }
    // Defaults change nothing and bookkeeping fields have no effect on the text: both are served.
    for (const extra of [{ response_format: { type: 'text' } }, { logprobs: false, presence_penalty: 0, logit_bias: {}, top_k: -1, tool_choice: 'none' }, { user: 'u-1', metadata: { a: 'b' } }]) {
      const res = await call('POST', url, m2(extra));
      assert.equal(res.status, 200, JSON.stringify(extra));
    }
    const schema = await call('POST', url, chat({ response_format: { type: 'json_schema' } }));
    assert.equal(schema.status, 400, 'json_schema needs its json_schema object');
    assert.deepEqual([schema.body.error.code, schema.body.error.param], ['missing_required_parameter', 'response_format.json_schema']);
  });

  it('routes a request that needs a capability only to workers that declare it, with the field carried', async () => {
    const discovery = tempDiscoveryUrl();
    // Two workers of m1: one whose engine declares nothing, one that declares json_object.
    const plain = await answeringFake();
    injectRecord(discovery, { worker_id: 'w-plain1', model: 'm1', request_url: plain.url, system_url: plain.url, engine: 'other', capabilities: NONE });
    const capable = await answeringFake();
    injectRecord(discovery, { worker_id: 'w-json', model: 'm1', request_url: capable.url, system_url: capable.url, engine: 'fake', capabilities: { ...NONE, json_object: true } });
    const frontend = await startFrontend(discovery);
    started.push(frontend);
    await frontend.waitForEvent('discovery_reset', (l) => (l.workers as string[]).includes('w-json') && (l.workers as string[]).includes('w-plain1'));
    const client = new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'unused' });
    for (let i = 0; i < 4; i++) {
      const res = await client.chat.completions.create({ ...chat({}), messages: [{ role: 'user', content: 'hi' }], response_format: { type: 'json_object' } });
      assert.deepEqual(JSON.parse(res.choices[0]?.message.content ?? ''), {});
    }
    assert.equal(capable.seen.length, 4, 'every json_object request went to the worker that declares it');
    assert.equal(plain.seen.length, 0);
    for (const seen of capable.seen) assert.deepEqual(JSON.parse(seen.body).response_format, { type: 'json_object' });
    const schemaReq = await call('POST', `${frontend.url}/v1/chat/completions`, chat({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object' } } } }));
    assert.equal(schemaReq.status, 400, 'json_schema: declared by nobody');
    assert.match(schemaReq.body.error.message, /engines: (fake, other|other, fake)/);
    // A model none of whose workers calls tools: tools is refused, naming it.
    injectRecord(discovery, { worker_id: 'w-plain', model: 'm2', request_url: capable.url, system_url: capable.url, engine: 'fake', capabilities: NONE });
    await frontend.waitForEvent('worker_added', (l) => l.worker_id === 'w-plain');
    const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }];
    const noTools = await call('POST', `${frontend.url}/v1/chat/completions`, { ...chat({ tools }), model: 'm2' });
    assert.equal(noTools.status, 400);
    assert.equal(noTools.body.error.param, 'tools');
    assert.match(noTools.body.error.message, /tools is not supported by any worker of model "m2" \(engines: fake\)/);
    const noLogprobs = await call('POST', `${frontend.url}/v1/chat/completions`, { ...chat({ logprobs: true }), model: 'm2' });
    assert.equal(noLogprobs.status, 400);
    assert.equal(noLogprobs.body.error.param, 'logprobs');
    // tool_choice none: the tools are only rendered, which any worker does.
    assert.equal((await call('POST', `${frontend.url}/v1/chat/completions`, { ...chat({ tools, tool_choice: 'none' }), model: 'm2' })).status, 200);
  });
});
