/**
 * Issue 42 item 13: a request must not be able to wedge or kill the fleet one worker at a time.
 * A 477-byte tool schema of nested minItems blocked the mocker's event loop (RSS 1.8 GB), and the
 * frontend retried it on the next worker: 3 of 3 workers wedged in 12 s. Now every schema is
 * measured before any engine sees it (protocol/schema-bounds.ts) and refused as OpenAI refuses a
 * schema it cannot serve, naming the field; and a request under which two workers died or went
 * silent is not sent to a third (frontend/relay/worker-losses.ts).
 */
import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { call } from './helpers/http.js';
import { streamCompletion } from './helpers/sse.js';
import { startFleet, type EbbProcess } from './helpers/processes.js';

const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

/** The 477 bytes: three levels of arrays of 1,000 at the least, a billion integers as the smallest answer. */
const WEDGE = {
  type: 'object',
  properties: {
    grid: {
      type: 'array',
      minItems: 1000,
      items: { type: 'array', minItems: 1000, items: { type: 'array', minItems: 1000, items: { type: 'integer', minimum: 0, maximum: 9 } } },
      description: 'a cube of digits, each row as long as the model likes, at least a thousand of each',
    },
    note: { type: 'string', description: 'anything the model wants to add about the cube it wrote, in its own words' },
  },
  required: ['grid'],
};

describe('a schema that would wedge a worker', () => {
  it('is a 400 naming the field, at once, on chat, Responses and the request plane; every worker keeps serving', async () => {
    const { frontend, workers } = await startFleet(3, ['--mocker-itl-ms', '0', '--mocker-ttft-ms', '0'], ['--stream-idle-timeout-ms', '2000']);
    started.push(frontend, ...workers);
    assert.ok(JSON.stringify(WEDGE).length < 600);
    const messages = [{ role: 'user', content: 'fill the cube' }];
    const tool = await call('POST', `${frontend.url}/v1/chat/completions`, { model: 'm1', messages, tools: [{ type: 'function', function: { name: 'cube', parameters: WEDGE } }], tool_choice: 'required' });
    assert.equal(tool.status, 400, JSON.stringify(tool.body));
    assert.deepEqual([tool.body.error.code, tool.body.error.param], ['invalid_function_parameters', 'tools[0].function.parameters']);
    // Where it is too long: the second level (a thousand arrays of a thousand digits) already is.
    assert.match(tool.body.error.message, /^Invalid schema for function 'cube': In context=\('properties', 'grid', 'items'\), 'minItems' 1000 makes a smallest valid answer of about 2,003,002 characters, more than ebb generates \(at most 100,000\)\.$/);

    const long = { type: 'object', properties: { s: { type: 'string', minLength: 1e8 } }, required: ['s'] };
    const format = await call('POST', `${frontend.url}/v1/chat/completions`, { model: 'm1', messages, response_format: { type: 'json_schema', json_schema: { name: 'long', schema: long } } });
    assert.deepEqual([format.status, format.body.error.code, format.body.error.param], [400, 'invalid_json_schema', 'response_format']);
    assert.match(format.body.error.message, /^Invalid schema for response_format 'long': In context=\('properties', 's'\), 'minLength' 100000000/);

    const client = new OpenAI({ baseURL: `${frontend.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    await assert.rejects(client.responses.create({ model: 'm1', input: 'x', text: { format: { type: 'json_schema', name: 'long', schema: long } } }), (err: unknown) => {
      assert.ok(err instanceof OpenAI.BadRequestError);
      assert.deepEqual([err.code, err.param], ['invalid_json_schema', 'text.format']);
      return true;
    });
    await assert.rejects(client.responses.create({ model: 'm1', input: 'x', tools: [{ type: 'function', name: 'cube', parameters: WEDGE, strict: false }] }), (err: unknown) => err instanceof OpenAI.BadRequestError && err.param === 'tools[0].parameters');

    // A direct caller of a worker's request plane gets the same answer: the worker bounds what its engine is given.
    const direct = await call('POST', `${workers[0]!.requestUrl}/generate`, { model: 'm1', messages, tools: [{ type: 'function', function: { name: 'cube', parameters: WEDGE } }], tool_choice: 'required', stream: false });
    assert.deepEqual([direct.status, direct.body.error.code], [400, 'invalid_function_parameters']);

    // Nobody was wedged: each worker answers at once (x-ebb-worker-id says which served).
    for (const w of workers) assert.equal((await call('GET', `${w.systemUrl}/live`)).status, 200, w.workerId);
    const served = await client.chat.completions.create({ model: 'm1', messages: [{ role: 'user', content: 'fill the cube' }], tools: [{ type: 'function', function: { name: 'cube', parameters: { type: 'object', properties: { n: { type: 'integer' } }, required: ['n'] } } }], tool_choice: 'required' });
    assert.equal(served.choices[0]?.finish_reason, 'tool_calls');
  });
});

describe('a request under which workers die', () => {
  it('is tried on a second worker, and when that one dies too it is answered 500 request_broke_workers: a third never gets it', async () => {
    // Every worker's engine dies on this prompt (--mocker-fail-on-prompt), as under a poison input.
    const { frontend, workers } = await startFleet(3, ['--mocker-itl-ms', '0', '--mocker-ttft-ms', '0', '--mocker-fail-on-prompt', 'poison pill']);
    started.push(frontend, ...workers);
    const res = await call('POST', `${frontend.url}/v1/chat/completions`, { model: 'm1', messages: [{ role: 'user', content: 'swallow the poison pill' }], max_tokens: 4 });
    assert.equal(res.status, 500, JSON.stringify(res.body));
    assert.deepEqual([res.body.error.code, res.body.error.type], ['request_broke_workers', 'server_error']);
    assert.match(res.body.error.message, /^2 workers failed under this request one after the other \(.+; .+\); it is not sent to another/);
    // Two engines failed (their workers shut down); the third was never sent it and serves.
    const failed = workers.filter((w) => w.logs.some((l) => l.event === 'engine_failed'));
    assert.equal(failed.length, 2, `engines failed: ${failed.map((w) => w.workerId).join(', ')}`);
    const spared = workers.find((w) => !failed.includes(w))!;
    const ok = await call('POST', `${frontend.url}/v1/chat/completions`, { model: 'm1', messages: [{ role: 'user', content: 'hello' }], max_tokens: 4 });
    assert.equal(ok.status, 200);
    assert.equal(ok.headers.get('x-ebb-worker-id'), spared.workerId);
  });

  it('mid-stream: the first worker SIGKILLed, the stream moves on; the second one SIGKILLed too, it ends with request_broke_workers, not on the third', async () => {
    const { frontend, workers } = await startFleet(3, ['--mocker-itl-ms', '15', '--mocker-ttft-ms', '0']);
    started.push(frontend, ...workers);
    const killed: string[] = [];
    const kill = (id: string) => {
      killed.push(id);
      workers.find((w) => w.workerId === id)!.signal('SIGKILL');
    };
    const outcome = await streamCompletion(frontend.url, { model: 'm1', max_tokens: 200, seed: 1 }, undefined, (n, seen) => {
      if (n === 10 && killed.length === 0) kill(seen.workerId!);
      // Tokens past the first kill come from the worker the stream moved to, which the frontend logged.
      else if (n === 30 && killed.length === 1) kill(frontend.logs.filter((l) => l.event === 'stream_migrated').at(-1)!.to_worker as string);
    });
    assert.equal(killed.length, 2, `killed ${killed.join(', ')}`);
    assert.equal(outcome.errorCode, 'request_broke_workers', outcome.error);
    assert.ok(outcome.tokens >= 30 && outcome.tokens < 200, `${outcome.tokens} tokens`);
    const moves = frontend.logs.filter((l) => l.event === 'stream_migrated');
    assert.equal(moves.length, 1, 'moved once, never to the third');
    const third = workers.find((w) => !killed.includes(w.workerId))!;
    assert.notEqual(moves[0]!.to_worker, third.workerId);
  });
});
