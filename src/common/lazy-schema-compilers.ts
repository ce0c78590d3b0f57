import { createRequire } from 'node:module';
import type { ValidatorFactory, ValidatorCompiler } from '@fastify/ajv-compiler';
import type { SerializerFactory, SerializerCompiler } from '@fastify/fast-json-stringify-compiler';

/**
 * Fastify's own schema compilers (ajv for bodies, fast-json-stringify for responses), with two
 * changes that matter at process start and nowhere else:
 * - a route's schema is compiled when the route first validates a request (or serializes an
 *   answer), not when the server starts: a worker compiled every route of its two servers, and
 *   ajv's meta-schema twice, before it could serve (about 100 ms of CPU per start, for routes most
 *   processes never see a body on); ajv and fast-json-stringify are loaded then too;
 * - one pool per process, so the servers of one process share one ajv.
 * Validation and serialization themselves are fastify's defaults, with the options the server passes.
 * (Fastify treats a factory given here as custom, so it would not lower-case a headers schema:
 * ebb validates no headers by schema.)
 */
type Validate = ReturnType<ValidatorCompiler> & { errors?: unknown };

const load = <T>(name: string): T => (createRequire(import.meta.url)(name) as () => T)();

let validatorPool: ValidatorFactory | undefined;
let serializerPool: SerializerFactory | undefined;

export const lazyValidators: ValidatorFactory = (externalSchemas, options) => {
  let compiler: ValidatorCompiler | undefined;
  return (route) => {
    let compiled: Validate | undefined;
    const validate = ((data: unknown) => {
      compiled ??= (compiler ??= (validatorPool ??= load<ValidatorFactory>('@fastify/ajv-compiler'))(externalSchemas, options))(route) as Validate;
      const result = compiled(data);
      // Fastify reads the errors from the function it was given.
      validate.errors = compiled.errors;
      return result;
    }) as Validate;
    return validate;
  };
};

export const lazySerializers: SerializerFactory = (externalSchemas, options) => {
  let compiler: SerializerCompiler | undefined;
  return (route) => {
    let compiled: ReturnType<SerializerCompiler> | undefined;
    return (doc: unknown) => (compiled ??= (compiler ??= (serializerPool ??= load<SerializerFactory>('@fastify/fast-json-stringify-compiler'))(externalSchemas, options))(route))(doc);
  };
};
