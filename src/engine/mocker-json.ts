import { EbbError } from '../protocol/errors.js';
import { SCHEMA_BOUNDS } from '../protocol/schema-bounds.js';
import type { ResponseFormat } from '../protocol/request-plane.js';

const WORDS = ['tide', 'harbor', 'river', 'shore', 'light', 'steady', 'quiet', 'flow'];

/** Formats a value is written in when a string schema names one (those agents and structured outputs use). */
const FORMATS: Record<string, string> = {
  'date-time': '2024-05-01T12:00:00Z',
  date: '2024-05-01',
  time: '12:00:00',
  email: 'tide@example.com',
  uri: 'https://example.com/tide',
  uuid: '3f2b6c1e-8d4a-4e7b-9c0d-5a1f2e3d4c5b',
  hostname: 'example.com',
  ipv4: '192.0.2.1',
};

/** JSON's and a call syntax's own pieces, each a token of the mocker's answer (so a stream can be cut mid-value). */
const PIECE = /\s*[^\s"{}[\]:,<>]+|\s*["{}[\]:,<>]/g;

/** A written answer (JSON, a tool call) as the mocker's tokens. */
export function pieces(text: string): string[] {
  return text.match(PIECE) ?? [];
}

/**
 * The mocker's structured answer (response_format json_object or json_schema), as its tokens:
 * JSON valid against the schema (json_object: an object with an `answer`), drawn with `random`.
 */
export function mockerJsonAnswer(format: ResponseFormat, random: () => number): string[] {
  if (format.type === 'json_schema' && format.json_schema.schema !== undefined) return pieces(JSON.stringify(mockerJson(format.json_schema.schema, random)));
  // json_object (or a schema-less json_schema): an object, as a model asked for JSON writes one.
  const words = Array.from({ length: 3 + Math.floor(random() * 6) }, () => WORDS[Math.floor(random() * WORDS.length)]);
  return pieces(JSON.stringify({ answer: words.join(' ') }));
}

type Node = Record<string, unknown>;
const isNode = (v: unknown): v is Node => typeof v === 'object' && v !== null && !Array.isArray(v);
const count = (v: unknown): number => (typeof v === 'number' && Number.isFinite(v) && v > 0 ? Math.floor(v) : 0);

/** Past this depth the writer takes the shortest way out: required properties only, the first choice. */
const BRANCHING_DEPTH = 4;

/**
 * The mocker's one schema walker: a value valid against a JSON Schema, drawn with `random`: its
 * tool calls' arguments and its structured output (response_format json_schema) both come from it.
 * It covers what function parameters and structured outputs use (objects with required and
 * optional properties, arrays with their bounds and prefixItems, strings with lengths, formats and
 * enums, numbers with bounds, consts, anyOf/oneOf/allOf, local $refs); a `pattern` is not generated
 * for. Bounded: the schemas it gets are within protocol/schema-bounds.ts's bounds (checked before
 * any engine sees them), and it stops with the same 400 past their answer size in any case, so no
 * schema can make it block the worker's event loop.
 */
export function mockerJson(schema: unknown, random: () => number): unknown {
  return new JsonWriter(schema, random).value(schema, 0);
}

class JsonWriter {
  /** Characters written so far, roughly: the bound a schema cannot take it past. */
  private written = 0;

  constructor(
    private readonly root: unknown,
    private readonly random: () => number,
  ) {}

  private spend(chars: number): void {
    this.written += chars;
    if (this.written > SCHEMA_BOUNDS.answerChars)
      throw new EbbError('invalid_json_schema', `the schema's answer would be longer than the mocker writes (${SCHEMA_BOUNDS.answerChars.toLocaleString('en-US')} characters)`, { param: 'response_format' });
  }

  private pick<T>(items: readonly T[]): T {
    return items[Math.floor(this.random() * items.length)]!;
  }

  value(s: unknown, depth: number): unknown {
    if (depth > SCHEMA_BOUNDS.depth * 2) throw new EbbError('invalid_json_schema', `the schema nests (or refers to itself) more than ${SCHEMA_BOUNDS.depth} levels deep`, { param: 'response_format' });
    this.spend(1);
    if (!isNode(s)) return WORDS[0];
    if (typeof s.$ref === 'string') return this.value(this.resolve(s.$ref), depth + 1);
    if ('const' in s) return s.const;
    if (Array.isArray(s.enum) && s.enum.length > 0) return this.pick(s.enum);
    const choices = (s.anyOf ?? s.oneOf) as unknown;
    if (Array.isArray(choices) && choices.length > 0) return this.value(depth >= BRANCHING_DEPTH ? this.plainest(choices) : this.pick(choices), depth + 1);
    if (Array.isArray(s.allOf) && s.allOf.length > 0) return this.value(merged(s), depth + 1);
    const types = Array.isArray(s.type) ? (s.type as unknown[]).map(String) : typeof s.type === 'string' ? [s.type] : [];
    const type = types.find((t) => t !== 'null') ?? types[0] ?? (s.properties !== undefined ? 'object' : s.items !== undefined || s.prefixItems !== undefined ? 'array' : 'string');
    switch (type) {
      case 'object':
        return this.object(s, depth);
      case 'array':
        return this.array(s, depth);
      case 'integer':
      case 'number':
        return this.number(s, type === 'integer');
      case 'boolean':
        return this.random() < 0.5;
      case 'null':
        return null;
      default:
        return this.string(s);
    }
  }

  private object(s: Node, depth: number): Record<string, unknown> {
    const props = isNode(s.properties) ? s.properties : {};
    const required = new Set(Array.isArray(s.required) ? (s.required as unknown[]).map(String) : []);
    const out: Record<string, unknown> = {};
    const keys = Object.keys(props);
    // Required properties always; the optional ones too near the top (as a model fills a form), none deep down.
    for (const key of keys) if (required.has(key) || depth < BRANCHING_DEPTH) out[key] = this.value(props[key], depth + 1);
    for (const key of required) if (!(key in out)) out[key] = this.value({}, depth + 1);
    const room = count(s.maxProperties) > 0 ? count(s.maxProperties) : Infinity;
    for (const key of Object.keys(out)) if (Object.keys(out).length > room && !required.has(key)) delete out[key];
    // minProperties beyond what the schema names: extra keys, where it allows them.
    for (let i = 0; Object.keys(out).length < count(s.minProperties) && s.additionalProperties !== false && i < count(s.minProperties); i++) out[`${WORDS[i % WORDS.length]}_${i}`] = this.value(isNode(s.additionalProperties) ? s.additionalProperties : {}, depth + 1);
    return out;
  }

  private array(s: Node, depth: number): unknown[] {
    const prefix = Array.isArray(s.prefixItems) ? (s.prefixItems as unknown[]) : Array.isArray(s.items) ? (s.items as unknown[]) : [];
    const max = typeof s.maxItems === 'number' ? Math.max(0, Math.floor(s.maxItems)) : Infinity;
    const n = Math.min(Math.max(count(s.minItems), prefix.length, 1), max);
    const items = isNode(s.items) ? s.items : {};
    return Array.from({ length: n }, (_, i) => this.value(i < prefix.length ? prefix[i] : items, depth + 1));
  }

  private number(s: Node, integer: boolean): number {
    const lo = typeof s.minimum === 'number' ? s.minimum : typeof s.exclusiveMinimum === 'number' ? s.exclusiveMinimum + (integer ? 1 : 0.5) : -Infinity;
    const hi = typeof s.maximum === 'number' ? s.maximum : typeof s.exclusiveMaximum === 'number' ? s.exclusiveMaximum - (integer ? 1 : 0.5) : Infinity;
    // Small numbers where the bounds allow them (zod's integers are bounded by 2^53): from 0, or the nearest bound.
    const from = Math.ceil(lo > 0 ? lo : hi < 0 ? Math.max(lo, hi - 100) : 0);
    const span = Math.max(0, Math.floor(Math.min(hi, from + 100)) - from);
    const n = from + Math.floor(this.random() * (span + 1));
    const step = typeof s.multipleOf === 'number' && s.multipleOf > 0 ? s.multipleOf : undefined;
    const value = step === undefined ? n : Math.ceil(n / step) * step;
    this.spend(String(value).length);
    return value;
  }

  private string(s: Node): string {
    const format = typeof s.format === 'string' ? FORMATS[s.format] : undefined;
    let text = format ?? this.pick(WORDS);
    const minLength = count(s.minLength);
    if (text.length < minLength) text = text.padEnd(minLength, ` ${text}`);
    if (typeof s.maxLength === 'number') text = text.slice(0, Math.max(0, Math.floor(s.maxLength)));
    this.spend(text.length);
    return text;
  }

  /** The choice with the least in it (no properties or items to fill): how a deep recursion ends. */
  private plainest(choices: unknown[]): unknown {
    const weight = (c: unknown) => (isNode(c) ? (c.type === 'null' ? 0 : c.properties !== undefined || c.items !== undefined || c.$ref !== undefined ? 2 : 1) : 1);
    return choices.reduce((a, b) => (weight(b) < weight(a) ? b : a));
  }

  private resolve(ref: string): unknown {
    if (!ref.startsWith('#')) return {};
    let v: unknown = this.root;
    for (const part of ref.slice(1).split('/').filter(Boolean)) v = isNode(v) ? v[decodeURIComponent(part).replaceAll('~1', '/').replaceAll('~0', '~')] : undefined;
    return v ?? {};
  }
}

/** allOf's parts as one schema: their properties and required lists together, the rest from the first part that says it. */
function merged(s: Node): Node {
  const parts = (s.allOf as unknown[]).filter(isNode);
  const out: Node = {};
  for (const p of [s, ...parts]) {
    for (const [k, v] of Object.entries(p)) if (k !== 'allOf' && k !== 'properties' && k !== 'required' && !(k in out)) out[k] = v;
    if (isNode(p.properties)) out.properties = { ...(out.properties as Node | undefined), ...p.properties };
    if (Array.isArray(p.required)) out.required = [...((out.required as unknown[] | undefined) ?? []), ...p.required];
  }
  return out;
}
