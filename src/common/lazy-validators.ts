import { createRequire } from 'node:module';
import type { ValidatorFactory, ValidatorCompiler } from '@fastify/ajv-compiler';

/**
 * Fastify's own ajv compiler, with two changes that matter at process start and nowhere else:
 * - a route's schema is compiled when the route first validates a request, not when the server
 *   starts (a worker compiled every route of its two servers, ajv's meta-schema twice, before it
 *   could serve: about 100 ms of CPU per start, for routes most processes never see a body on);
 * - one pool per process, so the servers of one process share one ajv (and one meta-schema).
 * The validation itself is fastify's default, with the options the server passes.
 */
type Validate = ReturnType<ValidatorCompiler> & { errors?: unknown };

let pool: ValidatorFactory | undefined;
const loadPool = (): ValidatorFactory => {
  // ajv itself is loaded on the first validated request too.
  const AjvCompiler = createRequire(import.meta.url)('@fastify/ajv-compiler') as () => ValidatorFactory;
  return AjvCompiler();
};

export const lazyValidators: ValidatorFactory = (externalSchemas, options) => {
  let compiler: ValidatorCompiler | undefined;
  return (route) => {
    let compiled: Validate | undefined;
    const validate = ((data: unknown) => {
      compiled ??= (compiler ??= (pool ??= loadPool())(externalSchemas, options))(route) as Validate;
      const result = compiled(data);
      // Fastify reads the errors from the function it was given.
      validate.errors = compiled.errors;
      return result;
    }) as Validate;
    return validate;
  };
};
