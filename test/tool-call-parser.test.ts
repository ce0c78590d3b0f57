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

  it('arguments written as a JSON string: the string\'s text is the arguments, however cut, and nothing of the call is content', () => {
    const args = { city: 'Pa"ris}', n: [1, { a: 2 }], path: 'C:\\tmp' };
    // The model writes the arguments object's text as a JSON string (a fine-tune's habit); a second call as an object.
    const text = `Checking.\n<tool_call>\n{"name": "get_weather", "arguments": ${JSON.stringify(JSON.stringify(args))}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>`;
    const whole = assemble([text]);
    assert.equal(whole.content, 'Checking.');
    assert.deepEqual(whole.calls.map((c) => [c.name, c.args]), [
      ['get_weather', JSON.stringify(args)],
      ['get_time', '{"tz": "UTC"}'],
    ]);
    assert.deepEqual(JSON.parse(whole.calls[0]!.args), args);
    for (let seed = 1; seed <= 200; seed++) assert.deepEqual(assemble(cut(text, seed)), whole, `cut with seed ${seed}`);
    const parsed = parseToolCalls(text.slice(text.indexOf('<tool_call>')), HERMES_SYNTAX, ids);
    assert.equal(parsed.content, null, 'non-streamed: only calls, no content');
    assert.equal(parsed.calls[0]!.function.arguments, JSON.stringify(args));
  });

  it('string arguments with \\u escapes: a surrogate pair is never sent in halves, however cut', () => {
    const text = '<tool_call>\n{"name": "f", "arguments": "{\\"e\\": \\"\\u00e9\\ud83d\\ude00\\", \\"t\\": \\"a\\\\tb\\"}"}\n</tool_call>';
    const expected = '{"e": "\u00e9\ud83d\ude00", "t": "a\\tb"}';
    assert.equal(assemble([text]).calls[0]!.args, expected);
    for (let seed = 1; seed <= 200; seed++) {
      const parser = new ToolCallParser(HERMES_SYNTAX, ids);
      const events: ToolEvent[] = [];
      for (const p of cut(text, seed)) parser.feed(p, events);
      parser.end(events);
      const pieces = events.filter((e) => e.kind === 'args').map((e) => (e as { text: string }).text);
      assert.equal(pieces.join(''), expected, `cut with seed ${seed}`);
      for (const p of pieces) assert.equal(Buffer.from(p).toString(), p, `seed ${seed}: a piece UTF-8 carries whole (${JSON.stringify(p)})`);
      assert.deepEqual(events.filter((e) => e.kind === 'content'), [], `seed ${seed}: no content`);
    }
  });

  it('bare scalar arguments and space before the value: the value alone, nothing leaks into content', () => {
    assert.deepEqual(assemble(['<tool_call>\n{"name": "f", "arguments": null}\n</tool_call>']), { content: '', calls: [{ id: ids(0), name: 'f', args: 'null' }], called: 1 });
    assert.deepEqual(assemble(['<tool_call>\n{"name": "f", "arguments":', '  ', ' {"a": 1}}\n</tool_call> done']), { content: 'done', calls: [{ id: ids(0), name: 'f', args: '{"a": 1}' }], called: 1 });
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
