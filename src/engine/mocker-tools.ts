import { CALL_SEPARATOR, forcedFunction, HERMES_SYNTAX, renderCall, toolsActive, type ToolSpec } from '../protocol/tools.js';
import type { GenerateRequest } from './engine.js';

const WORDS = ['tide', 'harbor', 'river', 'shore', 'light', 'steady', 'quiet', 'flow'];
const MAX_DEPTH = 6;

/**
 * A value valid against a JSON Schema, drawn with `random`: what the mocker's calls carry as
 * arguments. Covers what function parameters use (objects, arrays, strings, numbers, booleans,
 * enums, consts, anyOf/oneOf, bounds); a `pattern` or `format` is not generated for.
 */
export function sampleJson(schema: unknown, random: () => number, depth = 0): unknown {
  if (typeof schema !== 'object' || schema === null || depth > MAX_DEPTH) return null;
  const s = schema as Record<string, unknown>;
  if ('const' in s) return s.const;
  if (Array.isArray(s.enum) && s.enum.length > 0) return s.enum[Math.floor(random() * s.enum.length)];
  const choices = (s.anyOf ?? s.oneOf) as unknown[] | undefined;
  if (Array.isArray(choices) && choices.length > 0) return sampleJson(choices[Math.floor(random() * choices.length)], random, depth + 1);
  const types = Array.isArray(s.type) ? (s.type as string[]).filter((t) => t !== 'null') : [s.type];
  const type = types[0] ?? (s.properties !== undefined ? 'object' : 'string');
  switch (type) {
    case 'object': {
      const out: Record<string, unknown> = {};
      const props = (s.properties ?? {}) as Record<string, unknown>;
      for (const [key, sub] of Object.entries(props)) out[key] = sampleJson(sub, random, depth + 1);
      return out;
    }
    case 'array': {
      const count = Math.max(typeof s.minItems === 'number' ? s.minItems : 0, 1);
      const max = typeof s.maxItems === 'number' ? s.maxItems : count;
      return Array.from({ length: Math.min(count, max) }, () => sampleJson(s.items ?? { type: 'string' }, random, depth + 1));
    }
    case 'integer':
    case 'number': {
      const min = typeof s.minimum === 'number' ? s.minimum : typeof s.exclusiveMinimum === 'number' ? s.exclusiveMinimum + 1 : 0;
      const max = typeof s.maximum === 'number' ? s.maximum : typeof s.exclusiveMaximum === 'number' ? s.exclusiveMaximum - 1 : min + 100;
      return Math.ceil(min) + Math.floor(random() * (Math.floor(max) - Math.ceil(min) + 1));
    }
    case 'boolean':
      return random() < 0.5;
    case 'null':
      return null;
    default: {
      let word = WORDS[Math.floor(random() * WORDS.length)]!;
      const minLength = typeof s.minLength === 'number' ? s.minLength : 0;
      while (word.length < minLength) word += word;
      return typeof s.maxLength === 'number' ? word.slice(0, s.maxLength) : word;
    }
  }
}

/** JSON's and the call syntax's own pieces, each a token of the mocker's answer (so a stream can be cut mid-arguments). */
const PIECE = /\s*[^\s"{}[\]:,<>]+|\s*["{}[\]:,<>]/g;

/**
 * The mocker's tool calls for a request, as the pieces of its raw answer (Hermes syntax), or
 * undefined when it answers in text. Deterministic: a named choice calls that function; `required`
 * calls one (two different ones when parallel calls are allowed and there are two or more tools);
 * `auto` calls one about half the time, by the prompt, except right after a tool's result, which it
 * answers in text (so an agent loop ends).
 */
export function mockerToolScript(req: GenerateRequest, random: () => number): string[] | undefined {
  const tools = req.tools;
  if (tools === undefined || !toolsActive(tools, req.tool_choice)) return undefined;
  const forced = forcedFunction(req.tool_choice);
  let chosen: ToolSpec[];
  if (forced === 'required') {
    const first = Math.floor(random() * tools.length);
    chosen = req.parallel_tool_calls !== false && tools.length > 1 ? [tools[first]!, tools[(first + 1) % tools.length]!] : [tools[first]!];
  } else if (forced !== undefined) {
    chosen = tools.filter((t) => t.function.name === forced).slice(0, 1);
  } else {
    const last = req.messages?.[req.messages.length - 1];
    if (last?.role === 'tool' || random() < 0.5) return undefined;
    chosen = [tools[Math.floor(random() * tools.length)]!];
  }
  const text = chosen.map((t) => renderCall(HERMES_SYNTAX, t.function.name, JSON.stringify(sampleJson(t.function.parameters ?? { type: 'object' }, random)))).join(CALL_SEPARATOR);
  return text.match(PIECE) ?? [];
}
