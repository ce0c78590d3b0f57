import { EbbError, type ErrorCode } from '../protocol/errors.js';

/**
 * A body that fails its route's JSON Schema, answered as OpenAI answers one: the field at fault in
 * `param` (`messages[0].role`), OpenAI's code for what is wrong (`integer_below_min_value`, ...) and
 * its wording ("Invalid 'max_tokens': integer below minimum value. Expected a value >= 1, but got 0
 * instead."), instead of ajv's "body/max_tokens must be >= 1" with no param.
 */

/** One of ajv's errors (fastify's `err.validation`; the build's precompiled validators give the same). */
export interface SchemaViolation {
  instancePath: string;
  schemaPath: string;
  keyword: string;
  params: Record<string, unknown>;
  message?: string | undefined;
}

/** A JSON pointer's segments, unescaped. */
function segments(pointer: string): string[] {
  return pointer === '' ? [] : pointer.replace(/^#?\//, '').split('/').map((s) => s.replaceAll('~1', '/').replaceAll('~0', '~'));
}

/** An instance path as OpenAI names a parameter: `/messages/0/role` is `messages[0].role`. */
export function paramOf(instancePath: string, child?: string): string | null {
  const parts = segments(instancePath);
  if (child !== undefined) parts.push(child);
  let out = '';
  for (const p of parts) out += /^\d+$/.test(p) ? `[${p}]` : out === '' ? p : `.${p}`;
  return out === '' ? null : out;
}

function at(root: unknown, pointer: string): unknown {
  let v = root;
  for (const s of segments(pointer)) v = typeof v === 'object' && v !== null ? (v as Record<string, unknown>)[s] : undefined;
  return v;
}

/** The schema object that holds the failing keyword (schemaPath `#/properties/n/maximum`: the `n` schema). */
function schemaAt(schema: unknown, schemaPath: string): Record<string, unknown> | undefined {
  const node = at(schema, schemaPath.split('/').slice(0, -1).join('/'));
  return typeof node === 'object' && node !== null ? (node as Record<string, unknown>) : undefined;
}

const TYPE_NAMES: Record<string, string> = { integer: 'an integer', number: 'a decimal', string: 'a string', boolean: 'a boolean', object: 'an object', array: 'an array', null: 'null' };

/** What a JSON value is, in OpenAI's words. */
function kindOf(v: unknown): string {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'an array';
  if (typeof v === 'number') return Number.isInteger(v) ? 'an integer' : 'a decimal';
  return TYPE_NAMES[typeof v] ?? typeof v;
}

/** `a`, `a or b`, `a, b, or c`. */
function oneOf(names: string[]): string {
  if (names.length <= 2) return names.join(' or ');
  return `${names.slice(0, -1).join(', ')}, or ${names.at(-1)}`;
}

const quoted = (v: unknown) => `'${typeof v === 'string' ? v : JSON.stringify(v)}'`;

/** The types an error's schema allows (ajv gives "integer,null" or an array), null left out unless it is all. */
function typesOf(e: SchemaViolation): string[] {
  const t = e.params.type;
  const all = (Array.isArray(t) ? t : String(t).split(',')).map(String);
  const named = all.filter((x) => x !== 'null');
  return named.length > 0 ? named : all;
}

/**
 * The one violation a client is told about. With anyOf (several accepted shapes) ajv reports every
 * branch's failure: the deepest one says most (the branch that got furthest), and when every
 * branch failed on the value's type at the same place, one type error lists them all.
 */
function chosen(errors: readonly SchemaViolation[]): SchemaViolation & { types?: string[] } {
  const concrete = errors.filter((e) => e.keyword !== 'anyOf' && e.keyword !== 'oneOf' && e.keyword !== 'if');
  if (concrete.length === 0) return errors[0]!;
  const depth = (e: SchemaViolation) => segments(e.instancePath).length + (e.keyword === 'required' || e.keyword === 'additionalProperties' ? 1 : 0);
  const deepest = Math.max(...concrete.map(depth));
  const there = concrete.filter((e) => depth(e) === deepest);
  const beyondType = there.find((e) => e.keyword !== 'type');
  if (beyondType !== undefined) return beyondType;
  const all = [...new Set(there.flatMap(typesOf))];
  const named = all.filter((t) => t !== 'null');
  return { ...there[0]!, types: named.length > 0 ? named : all };
}

/** A route's body (or query, params) failed its schema: the 400 OpenAI would answer. */
export function schemaError(errors: readonly SchemaViolation[], data: unknown, schema: unknown): EbbError {
  if (errors.length === 0) return new EbbError('invalid_request', 'the request does not match its schema');
  const e = chosen(errors);
  const value = at(data, e.instancePath);
  const param = paramOf(e.instancePath);
  const name = param === null ? 'the request body' : `'${param}'`;
  const fail = (code: ErrorCode, message: string, p: string | null = param) => new EbbError(code, message, p === null ? {} : { param: p });
  const limit = e.params.limit as number;
  const integer = () => {
    const t = schemaAt(schema, e.schemaPath)?.type;
    return t === 'integer' || (Array.isArray(t) && t.includes('integer'));
  };
  const length = (v: unknown) => (Array.isArray(v) || typeof v === 'string' ? v.length : 0);
  switch (e.keyword) {
    case 'required': {
      const missing = paramOf(e.instancePath, String(e.params.missingProperty));
      return fail('missing_required_parameter', `Missing required parameter: '${missing}'.`, missing);
    }
    case 'additionalProperties': {
      const extra = paramOf(e.instancePath, String(e.params.additionalProperty));
      return fail('unknown_parameter', `Unknown parameter: '${extra}'.`, extra);
    }
    case 'type': {
      const types = e.types ?? typesOf(e);
      const expected = types.length > 1 ? `one of ${oneOf(types.map((t) => TYPE_NAMES[t] ?? t))}` : (TYPE_NAMES[types[0]!] ?? types[0]!);
      return fail('invalid_type', `Invalid type for ${name}: expected ${expected}, but got ${kindOf(value)} instead.`);
    }
    case 'minimum':
    case 'exclusiveMinimum': {
      const kind = integer() ? 'integer' : 'decimal';
      return fail(`${kind}_below_min_value`, `Invalid ${name}: ${kind} below minimum value. Expected a value ${e.keyword === 'minimum' ? '>=' : '>'} ${limit}, but got ${String(value)} instead.`);
    }
    case 'maximum':
    case 'exclusiveMaximum': {
      const kind = integer() ? 'integer' : 'decimal';
      return fail(`${kind}_above_max_value`, `Invalid ${name}: ${kind} above maximum value. Expected a value ${e.keyword === 'maximum' ? '<=' : '<'} ${limit}, but got ${String(value)} instead.`);
    }
    case 'minItems':
      return length(value) === 0
        ? fail('empty_array', `Invalid ${name}: empty array. Expected an array with minimum length ${limit}, but got an empty array instead.`)
        : fail('array_below_min_length', `Invalid ${name}: array too short. Expected an array with minimum length ${limit}, but got an array with length ${length(value)} instead.`);
    case 'maxItems':
      return fail('array_above_max_length', `Invalid ${name}: array too long. Expected an array with maximum length ${limit}, but got an array with length ${length(value)} instead.`);
    case 'minLength':
      return length(value) === 0
        ? fail('empty_string', `Invalid ${name}: empty string. Expected a string with minimum length ${limit}, but got an empty string instead.`)
        : fail('string_below_min_length', `Invalid ${name}: string too short. Expected a string with minimum length ${limit}, but got a string with length ${length(value)} instead.`);
    case 'maxLength':
      return fail('string_above_max_length', `Invalid ${name}: string too long. Expected a string with maximum length ${limit}, but got a string with length ${length(value)} instead.`);
    case 'enum':
    case 'const': {
      const allowed = e.keyword === 'enum' ? (e.params.allowedValues as unknown[]).filter((v) => v !== null) : [e.params.allowedValue];
      return fail('invalid_value', `Invalid value for ${name}: ${quoted(value)}. Supported values are: ${oneOf(allowed.map(quoted)).replace(/ or ([^,]*)$/, ' and $1')}.`);
    }
    case 'pattern':
      return fail('invalid_value', `Invalid ${name}: string does not match pattern. Expected a string that matches the pattern '${String(e.params.pattern)}'.`);
    default:
      return fail('invalid_value', `Invalid ${name}: ${e.message ?? `fails ${e.keyword}`}.`);
  }
}
