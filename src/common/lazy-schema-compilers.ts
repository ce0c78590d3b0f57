import { existsSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import type { ValidatorFactory, ValidatorCompiler } from '@fastify/ajv-compiler';
import type { SerializerFactory, SerializerCompiler } from '@fastify/fast-json-stringify-compiler';
import { packageFile } from './package-files.js';

/**
 * Fastify's own schema compilers (ajv for bodies, fast-json-stringify for responses), with three
 * changes that matter at process start and on a process's first request, nowhere else:
 * - a body schema the build precompiled (src/build/precompile-validators.ts) is validated by that
 *   code: no ajv loaded, nothing compiled (a worker paid about 150 ms of CPU on its first request);
 * - any other schema is compiled when its route first validates a request (or serializes an
 *   answer), not when the server starts, in one ajv per process;
 * - ajv skips the meta-schema check of ebb's own fixed schemas (test/route-schemas.test.ts makes it).
 * Fastify treats a factory given here as custom, so it would not lower-case a headers schema: ebb
 * validates no headers by schema.
 */
type Validate = ReturnType<ValidatorCompiler> & { errors?: unknown };

/** fastify's ajv defaults with ebb's changes: typed JSON bodies ("stream": "true" is a client bug), nothing removed. */
export const SERVER_AJV_CUSTOM = { coerceTypes: false, removeAdditional: false, validateSchema: false } as const;
export const SERVER_AJV_OPTIONS = { useDefaults: true, addUsedSchema: false, allErrors: false, ...SERVER_AJV_CUSTOM } as const;

/** Where the build writes the precompiled validators, and their index (schema JSON text -> file). */
export const PRECOMPILED_DIR = packageFile('dist', 'src', 'build', 'validators');
export const PRECOMPILED_MANIFEST = 'manifest.json';

const require = createRequire(import.meta.url);
const load = <T>(name: string): T => (require(name) as () => T)();

let manifest: Record<string, string> | undefined;
function precompiled(schema: unknown): Validate | undefined {
  if (manifest === undefined) {
    const path = join(PRECOMPILED_DIR, PRECOMPILED_MANIFEST);
    manifest = existsSync(path) ? (JSON.parse(readFileSync(path, 'utf8')) as Record<string, string>) : {};
  }
  const file = manifest[JSON.stringify(schema)];
  return file === undefined ? undefined : (require(join(PRECOMPILED_DIR, file)) as { default: Validate }).default;
}

let validatorPool: ValidatorFactory | undefined;
let serializerPool: SerializerFactory | undefined;

export const lazyValidators: ValidatorFactory = (externalSchemas, options) => {
  let compiler: ValidatorCompiler | undefined;
  return (route) => {
    let compiled: Validate | undefined;
    const validate = ((data: unknown) => {
      compiled ??=
        precompiled(route.schema) ??
        ((compiler ??= (validatorPool ??= load<ValidatorFactory>('@fastify/ajv-compiler'))(externalSchemas, options))(route) as Validate);
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
