import { EbbError } from './errors.js';
import type { ResponseFormat } from './request-plane.js';
import type { ToolSpec } from './tools.js';

/**
 * Bounds on what one JSON Schema (a response_format's, a tool's parameters) may make an engine do.
 * A schema is the caller's, and guided generation works in proportion to it: a 477-byte schema of
 * nested `minItems` (or one `minLength: 1e8`) asks for an answer of a hundred million values, which
 * blocked the mocker's event loop (1.8 GB) and would be a grammar of as many rules elsewhere. Every
 * schema is measured here before any engine sees it, in time linear in the schema's own size (it is
 * never expanded): too deep, too many subschemas, or a smallest valid answer longer than ebb
 * generates is refused as OpenAI refuses a schema it cannot serve, naming where in it the problem is.
 */

export const SCHEMA_BOUNDS = {
  /** Subschemas nested in one another (OpenAI's structured outputs allow 10). */
  depth: 32,
  /** Subschemas in all (OpenAI's allow 5,000 object properties). */
  subschemas: 10_000,
  /** Characters of the smallest answer the schema allows: past this no engine should be asked to write it. */
  answerChars: 100_000,
} as const;

/** Where in a schema a problem is, OpenAI's way: `('properties', 'steps', 'items')`. */
export type SchemaContext = readonly string[];

export interface SchemaProblem {
  context: SchemaContext;
  message: string;
}

type Node = Record<string, unknown>;

const isNode = (v: unknown): v is Node => typeof v === 'object' && v !== null && !Array.isArray(v);

/** The subschemas directly under `s`, each with the keys that lead to it. */
function children(s: Node): Array<[string[], unknown]> {
  const out: Array<[string[], unknown]> = [];
  for (const key of ['properties', 'patternProperties', '$defs', 'definitions', 'dependentSchemas'])
    if (isNode(s[key])) for (const [name, sub] of Object.entries(s[key])) out.push([[key, name], sub]);
  for (const key of ['items', 'additionalProperties', 'not', 'if', 'then', 'else', 'contains', 'propertyNames', 'unevaluatedItems', 'unevaluatedProperties', 'additionalItems'])
    if (isNode(s[key])) out.push([[key], s[key]]);
  for (const key of ['anyOf', 'oneOf', 'allOf', 'prefixItems', 'items'])
    if (Array.isArray(s[key])) (s[key] as unknown[]).forEach((sub, i) => out.push([[key, String(i)], sub]));
  return out;
}

/** A local reference (`#/$defs/x`, `#/definitions/x`, `#`) resolved against the root; undefined when it is not one. */
function resolve(root: unknown, ref: string): unknown {
  if (!ref.startsWith('#')) return undefined;
  let v: unknown = root;
  for (const part of ref.slice(1).split('/').filter(Boolean)) v = isNode(v) ? v[decodeURIComponent(part).replaceAll('~1', '/').replaceAll('~0', '~')] : undefined;
  return v;
}

const count = (v: unknown): number => (typeof v === 'number' && Number.isFinite(v) && v > 0 ? Math.floor(v) : 0);

/**
 * The length of the smallest JSON value `s` allows, in characters: what any engine must write at
 * the least. Linear in the schema: each subschema (and each reference) is measured once; a
 * reference to itself on the way to its own smallest value (a required recursion) allows none.
 */
class SmallestAnswer {
  private readonly memo = new Map<unknown, number>();
  private readonly open = new Set<unknown>();

  constructor(private readonly root: unknown) {}

  of(s: unknown): number {
    if (!isNode(s)) return s === false ? Infinity : 1; // `true` and `{}` allow anything: a digit
    const known = this.memo.get(s);
    if (known !== undefined) return known;
    if (this.open.has(s)) return Infinity;
    this.open.add(s);
    const size = this.measure(s);
    this.open.delete(s);
    this.memo.set(s, size);
    return size;
  }

  private measure(s: Node): number {
    if (typeof s.$ref === 'string') {
      const target = resolve(this.root, s.$ref);
      return target === undefined ? 1 : this.of(target);
    }
    if ('const' in s) return JSON.stringify(s.const ?? null).length;
    if (Array.isArray(s.enum)) return s.enum.length === 0 ? Infinity : Math.min(...s.enum.map((v) => JSON.stringify(v ?? null).length));
    const choices = (s.anyOf ?? s.oneOf) as unknown;
    if (Array.isArray(choices) && choices.length > 0) return Math.min(...choices.map((c) => this.of(c)));
    if (Array.isArray(s.allOf) && s.allOf.length > 0) return Math.max(...s.allOf.map((c) => this.of(c)));
    const types = Array.isArray(s.type) ? (s.type as unknown[]) : [s.type ?? (s.properties !== undefined ? 'object' : s.items !== undefined ? 'array' : 'any')];
    return Math.min(...types.map((t) => this.ofType(s, String(t))));
  }

  private ofType(s: Node, type: string): number {
    switch (type) {
      case 'object': {
        const props = isNode(s.properties) ? s.properties : {};
        const required = Array.isArray(s.required) ? (s.required as unknown[]).map(String) : [];
        let size = 2;
        for (const key of required) size += JSON.stringify(key).length + 2 + this.of(props[key] ?? {});
        // Properties asked for beyond the required ones: the smallest of the rest, or a short key.
        const more = Math.max(0, count(s.minProperties) - required.length);
        return size + more * 6;
      }
      case 'array': {
        const prefix = Array.isArray(s.prefixItems) ? (s.prefixItems as unknown[]) : Array.isArray(s.items) ? (s.items as unknown[]) : [];
        const rest = Math.max(0, count(s.minItems) - prefix.length);
        const each = rest === 0 ? 0 : this.of(isNode(s.items) ? s.items : {});
        return 2 + prefix.reduce<number>((sum, p) => sum + this.of(p) + 1, 0) + rest * (each + 1);
      }
      case 'string':
        return 2 + count(s.minLength);
      case 'boolean':
        return 4;
      case 'null':
        return 4;
      default:
        return 1;
    }
  }
}

const describe = (n: number) => (n === Infinity ? 'no finite answer' : `a smallest valid answer of about ${n.toLocaleString('en-US')} characters`);

/**
 * The first way `schema` passes the bounds, or undefined when it stays within them. Depth and the
 * number of subschemas first (a walk that stops at either bound), then the smallest answer, found
 * top-down to the subschema that makes it too long: the one whose own size is within bounds while
 * its repetition (minItems, minLength) or its required parts push it past.
 */
export function schemaOverBounds(schema: unknown): SchemaProblem | undefined {
  const stack: Array<[unknown, string[], number]> = [[schema, [], 0]];
  let seen = 0;
  while (stack.length > 0) {
    const [s, context, depth] = stack.pop()!;
    if (!isNode(s)) continue;
    if (++seen > SCHEMA_BOUNDS.subschemas) return { context, message: `the schema has more than ${SCHEMA_BOUNDS.subschemas.toLocaleString('en-US')} subschemas` };
    if (depth > SCHEMA_BOUNDS.depth) return { context, message: `the schema nests more than ${SCHEMA_BOUNDS.depth} levels deep` };
    for (const [keys, sub] of children(s)) stack.push([sub, [...context, ...keys], depth + 1]);
  }
  const smallest = new SmallestAnswer(schema);
  if (smallest.of(schema) <= SCHEMA_BOUNDS.answerChars) return undefined;
  // Down to the subschema that is too long while none of its parts is.
  let at: unknown = schema;
  const context: string[] = [];
  for (;;) {
    const node = at as Node;
    const over = children(node).find(([keys, sub]) => keys[0] !== '$defs' && keys[0] !== 'definitions' && smallest.of(sub) > SCHEMA_BOUNDS.answerChars);
    const ref = typeof node.$ref === 'string' ? resolve(schema, node.$ref) : undefined;
    if (over === undefined || ref !== undefined) {
      const why =
        typeof node.$ref === 'string'
          ? `'$ref' ${JSON.stringify(node.$ref)} leads to ${describe(smallest.of(node))}`
          : count(node.minItems) > 0
            ? `'minItems' ${node.minItems} makes ${describe(smallest.of(node))}`
            : count(node.minLength) > 0
              ? `'minLength' ${node.minLength} makes ${describe(smallest.of(node))}`
              : `the schema allows only ${describe(smallest.of(node))}`;
      return { context, message: `${why}, more than ebb generates (at most ${SCHEMA_BOUNDS.answerChars.toLocaleString('en-US')})` };
    }
    context.push(...over[0]);
    at = over[1];
  }
}

/** OpenAI's way of saying where: `In context=('properties', 'steps'), ...`. */
export function contextText(context: SchemaContext): string {
  return `In context=(${context.map((k) => `'${k}'`).join(', ')})`;
}

/** Where a request's schemas are, as its API names them (the field a refusal's param names). */
export interface SchemaParams {
  format: string;
  tool: (index: number) => string;
}

/** Chat's (and the request plane's) names. */
export const CHAT_SCHEMA_PARAMS: SchemaParams = { format: 'response_format', tool: (i) => `tools[${i}].function.parameters` };

/**
 * A request's schemas (its response_format's, each tool's parameters), within the bounds, or the
 * 400 OpenAI gives a schema it cannot serve: invalid_json_schema, or invalid_function_parameters
 * for a tool, naming where in the schema and which field holds it.
 */
export function boundSchemas(format: ResponseFormat | undefined, tools: readonly ToolSpec[] | undefined, params: SchemaParams = CHAT_SCHEMA_PARAMS): void {
  if (format?.type === 'json_schema' && format.json_schema.schema !== undefined) {
    const problem = schemaOverBounds(format.json_schema.schema);
    if (problem !== undefined)
      throw new EbbError('invalid_json_schema', `Invalid schema for response_format '${format.json_schema.name}': ${contextText(problem.context)}, ${problem.message}.`, { param: params.format });
  }
  tools?.forEach((t, i) => {
    const problem = t.function.parameters === undefined ? undefined : schemaOverBounds(t.function.parameters);
    if (problem !== undefined)
      throw new EbbError('invalid_function_parameters', `Invalid schema for function '${t.function.name}': ${contextText(problem.context)}, ${problem.message}.`, { param: params.tool(i) });
  });
}
