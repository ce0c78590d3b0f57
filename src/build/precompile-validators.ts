/**
 * Build step (after tsc): the body schemas of ebb's routes compiled to JavaScript once, with ajv's
 * standalone code, into dist/src/build/validators/. A server then validates with these instead of
 * loading ajv and compiling on its first request (about 100 ms of CPU for every worker and frontend
 * process). A schema found in no module here, or changed since the build, is compiled by ajv at run
 * time as before: the manifest is keyed by the schema's JSON text, so a stale entry never matches.
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { PRECOMPILED_DIR, PRECOMPILED_MANIFEST, SERVER_AJV_OPTIONS } from '../common/lazy-schema-compilers.js';
import { routeSchemas } from './route-schemas.js';

type AjvInstance = { compile(schema: object): unknown };
const require = createRequire(import.meta.url);
const Ajv = (require('ajv') as { default: new (opts: object) => AjvInstance }).default;
const standaloneCode = (require('ajv/dist/standalone') as { default: (ajv: AjvInstance, validate: unknown) => string }).default;

// Servers running from this dist (`npm start` beside `npm test`) load these files lazily: a file is
// rewritten only when its code changed, and never seen half-written (a temporary file renamed over it);
// the directory was once emptied and refilled on every build, and a request then met a missing module.
mkdirSync(PRECOMPILED_DIR, { recursive: true });
const written = new Set<string>();
function writeIfChanged(file: string, text: string): void {
  written.add(file);
  const path = join(PRECOMPILED_DIR, file);
  if (existsSync(path) && readFileSync(path, 'utf8') === text) return;
  writeFileSync(`${path}.${process.pid}.tmp`, text);
  renameSync(`${path}.${process.pid}.tmp`, path);
}
const manifest: Record<string, string> = {};
for (const { module, name, schema } of routeSchemas()) {
  // The options fastify's compiler gives ajv for ebb's servers (see lazy-schema-compilers.ts).
  const ajv = new Ajv({ ...SERVER_AJV_OPTIONS, code: { source: true } });
  const file = `${module}.${name}.cjs`;
  writeIfChanged(file, standaloneCode(ajv, ajv.compile(schema)));
  manifest[JSON.stringify(schema)] = file;
}
writeIfChanged(PRECOMPILED_MANIFEST, JSON.stringify(manifest));
// What no route validates with any more.
for (const file of readdirSync(PRECOMPILED_DIR)) if (!written.has(file)) rmSync(join(PRECOMPILED_DIR, file), { force: true });
