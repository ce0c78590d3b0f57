/**
 * OpenAI's statuses and error fields (issue 44 item 2): every error body has message, type, param
 * and code (param null where no one field is at fault); a body that fails its schema names the field
 * and says what is wrong in OpenAI's codes and words; 5xx types are OpenAI's. The openai SDK reads
 * them as it reads OpenAI's own. (401 invalid_api_key: api-keys.test.ts; 429: admission-queue.test.ts.)
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { call } from './helpers/http.js';
import { startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle, type WorkerHandle } from './helpers/processes.js';

const started: EbbProcess[] = [];
let frontend: FrontendHandle;
let worker: WorkerHandle;
before(async () => {
  const discovery = tempDiscoveryUrl();
  worker = await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '0', '--mocker-ttft-ms', '0']);
  started.push(worker);
  frontend = await startFrontend(discovery, ['--queue-timeout', '0']);
  started.push(frontend);
  await frontend.waitForLog((l) => l.event === 'worker_added' || (l.event === 'discovery_reset' && (l.workers as string[]).length > 0), 'the worker');
});
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

const hi = [{ role: 'user', content: 'hi' }];

/** Bodies that fail the chat schema, each with the param and code OpenAI answers it with, and its wording. */
const SCHEMA_CASES: Array<[string, Record<string, unknown>, string, string, RegExp]> = [
  ['temperature over its maximum', { temperature: 3 }, 'temperature', 'decimal_above_max_value', /^Invalid 'temperature': decimal above maximum value\. Expected a value <= 2, but got 3 instead\.$/],
  ['max_tokens under its minimum', { max_tokens: 0 }, 'max_tokens', 'integer_below_min_value', /^Invalid 'max_tokens': integer below minimum value\. Expected a value >= 1, but got 0 instead\.$/],
  ['no messages', { messages: [] }, 'messages', 'empty_array', /^Invalid 'messages': empty array\./],
  ['a role OpenAI does not have', { messages: [{ role: 'robot', content: 'x' }] }, 'messages[0].role', 'invalid_value', /^Invalid value for 'messages\[0\]\.role': 'robot'\. Supported values are: 'system', .* 'tool', and 'function'\.$/],
  ['content of no accepted type', { messages: [{ role: 'user', content: 5 }] }, 'messages[0].content', 'invalid_type', /^Invalid type for 'messages\[0\]\.content': expected one of a string or an array, but got an integer instead\.$/],
  ['five stop sequences', { stop: ['a', 'b', 'c', 'd', 'e'] }, 'stop', 'array_above_max_length', /array too long\. Expected an array with maximum length 4, but got an array with length 5 instead\.$/],
  ['stream as a string', { stream: 'true' }, 'stream', 'invalid_type', /^Invalid type for 'stream': expected a boolean, but got a string instead\.$/],
  ['a tool name with a space', { tools: [{ type: 'function', function: { name: 'a b' } }] }, 'tools[0].function.name', 'invalid_value', /does not match pattern/],
  ['json_schema without its schema object', { response_format: { type: 'json_schema' } }, 'response_format.json_schema', 'missing_required_parameter', /^Missing required parameter: 'response_format\.json_schema'\.$/],
];

describe('OpenAI error fields', () => {
  it('a body that fails its schema names its param, with OpenAI\'s code and wording', async () => {
    for (const [what, fields, param, code, message] of SCHEMA_CASES) {
      const res = await call('POST', `${frontend.url}/v1/chat/completions`, { model: 'm1', messages: hi, ...fields });
      assert.equal(res.status, 400, what);
      assert.deepEqual(Object.keys(res.body.error), ['message', 'type', 'param', 'code'], what);
      assert.equal(res.body.error.type, 'invalid_request_error', what);
      assert.equal(res.body.error.param, param, what);
      assert.equal(res.body.error.code, code, what);
      assert.match(res.body.error.message, message, what);
    }
    const missing = await call('POST', `${frontend.url}/v1/chat/completions`, { model: 'm1' });
    assert.deepEqual([missing.body.error.param, missing.body.error.code, missing.body.error.message], ['messages', 'missing_required_parameter', "Missing required parameter: 'messages'."]);
    const responses = await call('POST', `${frontend.url}/v1/responses`, { model: 'm1', input: 'x', max_output_tokens: 0 });
    assert.deepEqual([responses.status, responses.body.error.param, responses.body.error.code], [400, 'max_output_tokens', 'integer_below_min_value']);
  });

  it('through the openai SDK: a BadRequestError whose param is the field (temperature: 3 -> "temperature")', async () => {
    const client = new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'none', maxRetries: 0 });
    await assert.rejects(client.chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'hi' }], temperature: 3 }), (err: unknown) => {
      assert.ok(err instanceof OpenAI.BadRequestError, `a BadRequestError, not ${(err as Error).constructor.name}`);
      assert.equal(err.param, 'temperature');
      assert.equal(err.code, 'decimal_above_max_value');
      assert.equal(err.type, 'invalid_request_error');
      return true;
    });
  });

  it('param and code are always there: null param where no one field is at fault; a body that is not JSON is said so', async () => {
    const unknown = await call('POST', `${frontend.url}/v1/chat/completions`, { model: 'nope', messages: hi });
    assert.equal(unknown.status, 404);
    assert.deepEqual(unknown.body.error, { message: 'the model "nope" does not exist (no worker serves it)', type: 'invalid_request_error', param: null, code: 'model_not_found' });
    const garbled = await call('POST', `${frontend.url}/v1/chat/completions`, '{"model": "m1",');
    assert.equal(garbled.status, 400);
    assert.deepEqual([garbled.body.error.param, garbled.body.error.code], [null, 'invalid_request']);
    assert.match(garbled.body.error.message, /^We could not parse the JSON body of your request: /);
    const nowhere = await call('GET', `${frontend.url}/v1/nowhere`);
    assert.deepEqual(Object.keys(nowhere.body.error), ['message', 'type', 'param', 'code']);
  });

  it('a 503 is of OpenAI\'s server_error type, and the SDK sees an InternalServerError', async () => {
    const mark = frontend.mark();
    assert.equal((await call('POST', `${worker.systemUrl}/engine/drain`)).body.state, 'drained');
    await frontend.waitForEvent('worker_removed', (l) => l.worker_id === worker.workerId, { after: mark });
    try {
      const refused = await call('POST', `${frontend.url}/v1/chat/completions`, { model: 'm1', messages: hi, max_tokens: 2 });
      assert.equal(refused.status, 503);
      assert.deepEqual([refused.body.error.code, refused.body.error.type, refused.body.error.param], ['no_serving_worker', 'server_error', null]);
      const client = new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'none', maxRetries: 0 });
      await assert.rejects(client.chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 }), OpenAI.InternalServerError);
    } finally {
      assert.equal((await call('POST', `${worker.systemUrl}/engine/resume`)).body.state, 'serving');
    }
  });
});
