import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { HERMES_SYNTAX, type ToolCallSyntax } from '../src/protocol/tools.js';
import { callIds, parseToolCalls, ToolCallParser, type ToolEvent } from '../src/frontend/wire/tool-call-parser.js';
import { prng } from '../src/engine/mocker.js';

const ids = callIds('request', 0);

/** The events of `text` fed in the given pieces, assembled as an SDK assembles the stream. */
function assemble(pieces: string[], syntax: ToolCallSyntax = HERMES_SYNTAX) {
  const parser = new ToolCallParser(syntax, ids);
  const events: ToolEvent[] = [];
  for (const p of pieces) parser.feed(p, events);
  parser.end(events);
  let content = '';
  const calls: Array<{ id: string; name: string; args: string }> = [];
  for (const e of events) {
    if (e.kind === 'content') content += e.text;
    else if (e.kind === 'call') calls[e.index] = { id: e.id, name: e.name, args: '' };
    else calls[e.index]!.args += e.text;
  }
  return { content, calls, called: parser.called };
}

/** `text` cut at random places (always the same places for a seed). */
function cut(text: string, seed: number): string[] {
  const random = prng(seed);
  const out: string[] = [];
  for (let at = 0; at < text.length; ) {
    const len = 1 + Math.floor(random() * 7);
    out.push(text.slice(at, at + len));
    at += len;
  }
  return out;
}

const TWO_CALLS = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris}", "n": [1, {"a": 2}]}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>';

describe('tool call parser', () => {
  it('parses the same calls however the text is cut into pieces (a migrated stream is cut elsewhere)', () => {
    const whole = assemble([TWO_CALLS]);
    assert.equal(whole.content, 'Let me look.');
    assert.deepEqual(whole.calls.map((c) => [c.name, c.args]), [
      ['get_weather', '{"city": "Pa\\"ris}", "n": [1, {"a": 2}]}'],
      ['get_time', '{}'],
    ]);
    for (let seed = 1; seed <= 200; seed++) assert.deepEqual(assemble(cut(TWO_CALLS, seed)), whole, `cut with seed ${seed}`);
  });

  it('text without a call is content, held text that only looked like a prefix included', () => {
    assert.deepEqual(assemble(['a <tool', '_cal', 'l is not ', 'a call']), { content: 'a <tool_call is not a call', calls: [], called: 0 });
    assert.deepEqual(assemble(['ends with <tool_ca']), { content: 'ends with <tool_ca', calls: [], called: 0 });
  });

  it('a call cut by max_tokens keeps its arguments so far and counts as called', () => {
    const r = assemble(['<tool_call>\n{"name": "f", "arguments": {"x": ', '"ab']);
    assert.deepEqual(r.calls, [{ id: ids(0), name: 'f', args: '{"x": "ab' }]);
    assert.equal(r.called, 1);
  });

  it('other syntaxes: node-llama-cpp\'s default wrapper call (||call: name(params))', () => {
    const syntax = { prefix: '||call: ', params_prefix: '(', suffix: ')' };
    const r = assemble(cut('sure ||call: get_time({"tz": "UTC"})', 3), syntax);
    assert.equal(r.content, 'sure', 'space next to a call is not content');
    assert.deepEqual(r.calls.map((c) => [c.name, c.args]), [['get_time', '{"tz": "UTC"}']]);
  });

  it('non-streamed answers: content null when only calls; ids from the request, per choice and call', () => {
    const parsed = parseToolCalls(TWO_CALLS.slice(TWO_CALLS.indexOf('<tool_call>')), HERMES_SYNTAX, ids);
    assert.equal(parsed.content, null);
    assert.deepEqual(parsed.calls.map((c) => c.id), [ids(0), ids(1)]);
    assert.equal(callIds('request', 0)(1), ids(1), 'the same request, the same ids');
    assert.notEqual(callIds('request', 1)(0), ids(0), 'another choice, other ids');
    assert.notEqual(callIds('other request', 0)(0), ids(0));
  });
});
