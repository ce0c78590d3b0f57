/**
 * Build step (after tsc): the body schemas of ebb's routes compiled to JavaScript once, with ajv's
 * standalone code, into dist/src/build/validators/. A server then validates with these instead of
 * loading ajv and compiling on its first request (about 100 ms of CPU for every worker and frontend
 * process). A schema found in no module here, or changed since the build, is compiled by ajv at run
 * time as before: the manifest is keyed by the schema's JSON text, so a stale entry never matches.
 */
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { PRECOMPILED_DIR, PRECOMPILED_MANIFEST, SERVER_AJV_OPTIONS } from '../common/lazy-schema-compilers.js';
import { routeSchemas } from './route-schemas.js';

type AjvInstance = { compile(schema: object): unknown };
const require = createRequire(import.meta.url);
const Ajv = (require('ajv') as { default: new (opts: object) => AjvInstance }).default;
const standaloneCode = (require('ajv/dist/standalone') as { default: (ajv: AjvInstance, validate: unknown) => string }).default;

rmSync(PRECOMPILED_DIR, { recursive: true, force: true });
mkdirSync(PRECOMPILED_DIR, { recursive: true });
const manifest: Record<string, string> = {};
for (const { module, name, schema } of routeSchemas()) {
  // The options fastify's compiler gives ajv for ebb's servers (see lazy-schema-compilers.ts).
  const ajv = new Ajv({ ...SERVER_AJV_OPTIONS, code: { source: true } });
  const file = `${module}.${name}.cjs`;
  writeFileSync(join(PRECOMPILED_DIR, file), standaloneCode(ajv, ajv.compile(schema)));
  manifest[JSON.stringify(schema)] = file;
}
writeFileSync(join(PRECOMPILED_DIR, PRECOMPILED_MANIFEST), JSON.stringify(manifest));
