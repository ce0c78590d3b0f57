import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { EMBEDDINGS_FIELD_POLICY, FIELD_POLICY, INPUT_TOKENS_FIELD_POLICY, RESPONSES_FIELD_POLICY } from '../src/frontend/api/field-policy.js';
import { call } from './helpers/http.js';
import { ERROR_CODES, isErrorCode, type ErrorCode } from '../src/protocol/errors.js';
import { startFrontend, startWorker, tempDiscoveryUrl, type EbbProcess, type FrontendHandle } from './helpers/processes.js';

const started: EbbProcess[] = [];
let frontend: FrontendHandle;
before(async () => {
  const discovery = tempDiscoveryUrl();
  started.push(await startWorker(['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', '0', '--mocker-ttft-ms', '0']));
  frontend = await startFrontend(discovery);
  started.push(frontend);
});
after(async () => {
  await Promise.all(started.map((p) => p.stop()));
});

/** Per field: values a request may carry (200), and values refused with a 400 naming the field. */
type Examples = Record<string, { ok: unknown[]; refused: unknown[] }>;

const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }];
/** A schema whose smallest answer is 100 million characters: past what any engine is asked to write. */
const HUGE = { type: 'object', properties: { s: { type: 'string', minLength: 1e8 } }, required: ['s'] };

/** Penalties, logit_bias, top_k, min_p: carried to engines that declare `sampling` (the mocker does; their effect: sampling.test.ts). */
const SAMPLING: Examples = {
  presence_penalty: { ok: [0, 0.5, -1], refused: [3] },
  frequency_penalty: { ok: [0, 0.5], refused: [-2.5] },
  repetition_penalty: { ok: [1, 1.3], refused: [0] },
  logit_bias: { ok: [{}, { '1': 5 }], refused: [{ x: 1 }, { '1': 101 }, { '2000000': 1 }] }, // 2000000: past the mocker's tokenizer
  top_k: { ok: [0, -1, 5], refused: [-2] },
  min_p: { ok: [0, 0.1], refused: [1.5] },
};

const CHAT: Examples = {
  model: { ok: ['m1'], refused: [] },
  messages: { ok: [[{ role: 'user', content: [{ type: 'text', text: 'hi' }] }]], refused: [[{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'http://x/y.png' } }] }]] },
  prompt: { ok: [], refused: [] }, // completions only: see COMPLETIONS
  max_tokens: { ok: [2], refused: [] },
  max_completion_tokens: { ok: [2], refused: [] },
  temperature: { ok: [0, 1.5], refused: [] },
  top_p: { ok: [0.5], refused: [] },
  seed: { ok: [7], refused: [] },
  stop: { ok: ['x', ['a', 'b']], refused: [] },
  stream: { ok: [false, true], refused: [] },
  stream_options: { ok: [], refused: [{ include_usage: true }] }, // without stream: true (with it: the SDK tests)
  n: { ok: [2, 40], refused: [129] }, // OpenAI's 128 (--max-lanes-per-request bounds prompts x n: frontend-limits.test.ts)
  // The mocker writes JSON (a model whose workers do not: capabilities.test.ts); a schema past the bounds is refused (schema-bounds.test.ts).
  response_format: { ok: [{ type: 'text' }, { type: 'json_object' }, { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object' } } }], refused: [{ type: 'json_schema', json_schema: { name: 'x', schema: HUGE } }] },
  user: { ok: ['u-1'], refused: [] },
  metadata: { ok: [{ k: 'v' }], refused: [] },
  store: { ok: [false, true], refused: [] },
  service_tier: { ok: ['auto', 'scale', 'fast'], refused: ['turbo'] },
  parallel_tool_calls: { ok: [false, true], refused: [] },
  prediction: { ok: [{ type: 'content', content: 'hi there' }], refused: [] },
  prompt_cache_key: { ok: ['k'], refused: [] },
  prompt_cache_retention: { ok: ['24h'], refused: [] },
  prompt_cache_options: { ok: [{ mode: 'implicit' }], refused: [] },
  safety_identifier: { ok: ['s-1'], refused: [] },
  moderation: { ok: [null], refused: [{ model: 'omni-moderation-latest' }] },
  reasoning_effort: { ok: [null, 'none'], refused: ['low', 'high'] },
  verbosity: { ok: [null, 'medium'], refused: ['low'] },
  modalities: { ok: [['text']], refused: [['text', 'audio']] },
  audio: { ok: [null], refused: [{ voice: 'alloy', format: 'mp3' }] },
  web_search_options: { ok: [null], refused: [{}] },
  logprobs: { ok: [false, true], refused: [] }, // the mocker reports them; a model whose workers do not: capabilities.test.ts
  top_logprobs: { ok: [0], refused: [2] }, // without logprobs: true
  tools: { ok: [[], tools], refused: [[{ type: 'function', function: { name: 'f', parameters: HUGE } }]] }, // the mocker calls tools; a model whose workers do not: capabilities.test.ts
  tool_choice: { ok: ['none', 'auto'], refused: ['required', { type: 'function', function: { name: 'f' } }] }, // without tools to choose from
  functions: { ok: [[], [{ name: 'f', parameters: { type: 'object' } }]], refused: [[{ name: 'f', parameters: HUGE }]] }, // mapped to tools (their effect: openai-conformance.test.ts)
  function_call: { ok: ['none', 'auto'], refused: [{ name: 'g' }] }, // a named one must be among functions
  ...SAMPLING,
  best_of: { ok: [1], refused: [2] },
  echo: { ok: [false], refused: [true] },
  suffix: { ok: [null], refused: ['tail'] },
};

const COMPLETIONS: Examples = {
  prompt: { ok: ['x', ['a', 'b'], [1, 2, 3], [[1, 2], [3]]], refused: [[1, 'a'], [-1]] }, // token ids: the mocker declares prompt_token_ids
};

const RESPONSES: Examples = {
  model: { ok: ['m1'], refused: [] },
  input: {
    ok: ['hi', [{ role: 'user', content: 'hi' }], [{ role: 'user', content: 'hi' }, { type: 'function_call', call_id: 'c', name: 'f', arguments: '{}' }, { type: 'function_call_output', call_id: 'c', output: 'x' }]],
    refused: [[{ role: 'user', content: [{ type: 'input_image', image_url: 'http://x/y.png' }] }], [{ type: 'reasoning', summary: [] }]],
  },
  instructions: { ok: ['be brief'], refused: [] },
  max_output_tokens: { ok: [2], refused: [] },
  temperature: { ok: [0.2], refused: [] },
  top_p: { ok: [0.9], refused: [] },
  ...SAMPLING,
  stream: { ok: [false], refused: [] },
  text: { ok: [{ format: { type: 'text' } }, { format: { type: 'json_object' } }, { verbosity: 'medium' }], refused: [{ format: { type: 'json_schema', name: 'x', schema: HUGE } }, { verbosity: 'low' }] },
  user: { ok: ['u'], refused: [] },
  metadata: { ok: [{ k: 'v' }], refused: [{ k: 1 }] },
  service_tier: { ok: ['auto', 'scale'], refused: ['turbo'] },
  parallel_tool_calls: { ok: [true], refused: [] },
  truncation: { ok: ['disabled', 'auto'], refused: ['sometimes'] },
  max_tool_calls: { ok: [3], refused: [] },
  prompt_cache_key: { ok: ['k'], refused: [] },
  prompt_cache_retention: { ok: ['24h'], refused: [] },
  prompt_cache_options: { ok: [{ mode: 'implicit' }], refused: [] },
  safety_identifier: { ok: ['s-1'], refused: [] },
  stream_options: { ok: [{ include_obfuscation: false }], refused: [] },
  moderation: { ok: [null], refused: [{ model: 'omni-moderation-latest' }] },
  context_management: { ok: [[]], refused: [[{ type: 'compaction', compact_threshold: 1000 }]] },
  store: { ok: [false, true], refused: [] },
  previous_response_id: { ok: [null], refused: ['resp_1'] }, // one this frontend kept: resumable-streams.test.ts
  conversation: { ok: [null], refused: ['conv_1'] },
  background: { ok: [false, true], refused: [] },
  tools: { ok: [[], [{ type: 'function', name: 'f', parameters: { type: 'object' } }]], refused: [[{ type: 'web_search' }], [{ type: 'function', name: 'f', parameters: HUGE }]] },
  tool_choice: { ok: ['auto', 'none'], refused: ['required', { type: 'function', name: 'f' }] }, // without tools to choose from
  include: { ok: [[]], refused: [['message.output_text.logprobs']] },
  reasoning: { ok: [{}, { effort: 'none' }], refused: [{ effort: 'high' }, { effort: 'none', summary: 'auto' }] },
  top_logprobs: { ok: [0], refused: [3] },
  prompt: { ok: [null], refused: [{ id: 'pmpt_1' }] },
};

/** POST /v1/responses/input_tokens (the counts themselves: openai-conformance.test.ts). */
const INPUT_TOKENS: Examples = {
  model: { ok: ['m1'], refused: [] },
  input: { ok: ['hi', [{ role: 'user', content: 'hi' }]], refused: [[{ type: 'reasoning', summary: [] }]] },
  instructions: { ok: ['be brief'], refused: [] },
  previous_response_id: { ok: [null], refused: ['resp_1'] },
  conversation: { ok: [null], refused: ['conv_1'] },
  reasoning: { ok: [{}], refused: [{ effort: 'high' }] },
  tools: { ok: [[]], refused: [[{ type: 'function', name: 'f', parameters: { type: 'object' } }]] },
  personality: { ok: [], refused: ['friendly'] },
  tool_choice: { ok: ['auto'], refused: [] },
  parallel_tool_calls: { ok: [false], refused: [] },
  text: { ok: [{ format: { type: 'json_object' } }], refused: [] },
  truncation: { ok: ['auto'], refused: [] },
};

const EMBEDDINGS: Examples = {
  model: { ok: ['m1'], refused: [] },
  input: { ok: ['x', ['a', 'b'], [1, 2], [[1], [2, 3]]], refused: [[], [''], [1, 'a'], [-1]] }, // token ids: the mocker declares prompt_token_ids
  dimensions: { ok: [8, null], refused: [0, 65] }, // 65: more than the mocker's 64, refused by the worker naming it
  encoding_format: { ok: ['float', 'base64'], refused: ['hex'] },
  user: { ok: ['u-1'], refused: [] },
};

async function expectRow(url: string, base: Record<string, unknown>, field: string, { ok, refused }: { ok: unknown[]; refused: unknown[] }) {
  for (const value of ok) {
    const res = await call('POST', url, { ...base, [field]: value });
    assert.equal(res.status, 200, `${field}=${JSON.stringify(value)} is served: ${JSON.stringify(res.body)}`);
  }
  for (const value of refused) {
    const res = await call('POST', url, { ...base, [field]: value });
    assert.equal(res.status, 400, `${field}=${JSON.stringify(value)} is refused`);
    // unsupported_parameter, invalid_request, or the schema's own code (integer_below_min_value, ...): a 400 of the catalogue.
    assert.equal(isErrorCode(res.body.error.code) && ERROR_CODES[res.body.error.code as ErrorCode].status, 400, res.body.error.code);
    assert.ok(String(res.body.error.param ?? res.body.error.message).includes(field), `the error names ${field}: ${JSON.stringify(res.body.error)}`);
  }
}

describe('field policy: every row of the table, against a running frontend', () => {
  it('the examples cover exactly the rows of both tables', () => {
    assert.deepEqual(Object.keys(CHAT).sort(), Object.keys(FIELD_POLICY).sort());
    assert.deepEqual(Object.keys(RESPONSES).sort(), Object.keys(RESPONSES_FIELD_POLICY).sort());
    assert.deepEqual(Object.keys(EMBEDDINGS).sort(), Object.keys(EMBEDDINGS_FIELD_POLICY).sort());
    assert.deepEqual(Object.keys(INPUT_TOKENS).sort(), Object.keys(INPUT_TOKENS_FIELD_POLICY).sort());
  });

  it('chat completions', async () => {
    const base = { model: 'm1', messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 };
    for (const [field, row] of Object.entries(CHAT)) await expectRow(`${frontend.url}/v1/chat/completions`, base, field, row);
  });

  it('completions', async () => {
    const base = { model: 'm1', prompt: 'hi', max_tokens: 2 };
    for (const [field, row] of Object.entries(COMPLETIONS)) await expectRow(`${frontend.url}/v1/completions`, base, field, row);
  });

  it('responses', async () => {
    const base = { model: 'm1', input: 'hi', max_output_tokens: 2 };
    for (const [field, row] of Object.entries(RESPONSES)) await expectRow(`${frontend.url}/v1/responses`, base, field, row);
  });

  it('responses input_tokens', async () => {
    const base = { model: 'm1', input: 'hi' };
    for (const [field, row] of Object.entries(INPUT_TOKENS)) await expectRow(`${frontend.url}/v1/responses/input_tokens`, base, field, row);
  });

  it('embeddings', async () => {
    const base = { model: 'm1', input: 'hi' };
    for (const [field, row] of Object.entries(EMBEDDINGS)) await expectRow(`${frontend.url}/v1/embeddings`, base, field, row);
  });

  it('carried fields take effect: stop ends early, seed picks the text, max_tokens bounds it', async () => {
    const url = `${frontend.url}/v1/completions`;
    const base = { model: 'm1', prompt: 'once upon a time', max_tokens: 8 };
    const full = (await call('POST', url, base)).body.choices[0].text as string;
    const word = full.trim().split(' ')[2]!;
    const stopped = (await call('POST', url, { ...base, stop: word })).body.choices[0];
    assert.equal(stopped.finish_reason, 'stop');
    assert.ok(!stopped.text.includes(word) && full.startsWith(stopped.text));
    assert.notEqual((await call('POST', url, { ...base, seed: 99 })).body.choices[0].text, full);
    assert.equal((await call('POST', url, { ...base, max_tokens: 3 })).body.usage.completion_tokens, 3);
  });
});
