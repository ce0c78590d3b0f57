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
import * as admin from '../protocol/admin.js';
import * as requestPlane from '../protocol/request-plane.js';
import * as openai from '../frontend/api/openai-schema.js';
import { PRECOMPILED_DIR, PRECOMPILED_MANIFEST, SERVER_AJV_OPTIONS } from '../common/lazy-schema-compilers.js';

type AjvInstance = { compile(schema: object): unknown };
const require = createRequire(import.meta.url);
const Ajv = (require('ajv') as { default: new (opts: object) => AjvInstance }).default;
const standaloneCode = (require('ajv/dist/standalone') as { default: (ajv: AjvInstance, validate: unknown) => string }).default;

const modules: Record<string, Record<string, unknown>> = { admin, 'request-plane': requestPlane, 'openai-schema': openai };

rmSync(PRECOMPILED_DIR, { recursive: true, force: true });
mkdirSync(PRECOMPILED_DIR, { recursive: true });
const manifest: Record<string, string> = {};
for (const [name, mod] of Object.entries(modules)) {
  for (const [key, schema] of Object.entries(mod)) {
    if (!/schema$/i.test(key) || typeof schema !== 'object' || schema === null) continue;
    // The options fastify's compiler gives ajv for ebb's servers (see lazy-schema-compilers.ts).
    const ajv = new Ajv({ ...SERVER_AJV_OPTIONS, code: { source: true } });
    const file = `${name}.${key}.cjs`;
    writeFileSync(join(PRECOMPILED_DIR, file), standaloneCode(ajv, ajv.compile(schema)));
    manifest[JSON.stringify(schema)] = file;
  }
}
writeFileSync(join(PRECOMPILED_DIR, PRECOMPILED_MANIFEST), JSON.stringify(manifest));
