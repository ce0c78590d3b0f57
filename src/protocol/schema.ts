import type TypeBox from 'typebox';

/**
 * The JSON Schema builders the protocol's wire types use, with TypeBox's own signatures (so
 * `Static<typeof X>` is TypeBox's), but not its runtime: TypeBox is some 370 ES modules, about
 * 0.3-0.4 s of CPU at every worker and frontend start, for a dozen functions that return plain
 * JSON Schema. test/protocol-schema.test.ts checks each builder's output against TypeBox's.
 */
type T = typeof TypeBox;
type Schema = Record<string, unknown>;

const OPTIONAL = '~optional';
const isOptional = (s: unknown): boolean => (s as Schema)[OPTIONAL] === true;

const Optional = (schema: Schema): Schema => Object.defineProperty({ ...schema }, OPTIONAL, { value: true, enumerable: false });
const Object_ = (properties: Record<string, Schema>, options: Schema = {}): Schema => {
  const required = Object.keys(properties).filter((k) => !isOptional(properties[k]));
  return { type: 'object', ...(required.length > 0 ? { required } : {}), properties, ...options };
};

export const Type = {
  String: ((options: Schema = {}) => ({ type: 'string', ...options })) as unknown as T['String'],
  Integer: ((options: Schema = {}) => ({ type: 'integer', ...options })) as unknown as T['Integer'],
  Number: ((options: Schema = {}) => ({ type: 'number', ...options })) as unknown as T['Number'],
  Boolean: ((options: Schema = {}) => ({ type: 'boolean', ...options })) as unknown as T['Boolean'],
  Null: ((options: Schema = {}) => ({ type: 'null', ...options })) as unknown as T['Null'],
  Unknown: ((options: Schema = {}) => ({ ...options })) as unknown as T['Unknown'],
  Literal: ((value: string | number | boolean, options: Schema = {}) => ({ type: typeof value, const: value, ...options })) as unknown as T['Literal'],
  Array: ((items: Schema, options: Schema = {}) => ({ type: 'array', items, ...options })) as unknown as T['Array'],
  Union: ((anyOf: Schema[], options: Schema = {}) => ({ anyOf, ...options })) as unknown as T['Union'],
  /** Only string keys, as the protocol uses it. */
  Record: ((_key: Schema, value: Schema, options: Schema = {}) => ({ type: 'object', patternProperties: { '^.*$': value }, ...options })) as unknown as T['Record'],
  Object: Object_ as unknown as T['Object'],
  Optional: Optional as unknown as T['Optional'],
};
