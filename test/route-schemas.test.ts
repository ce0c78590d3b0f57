import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import * as admin from '../src/protocol/admin.js';
import * as requestPlane from '../src/protocol/request-plane.js';
import * as openai from '../src/frontend/api/openai-schema.js';
import { routeSchemas } from '../src/build/route-schemas.js';
import { lazyValidators, PRECOMPILED_DIR, PRECOMPILED_MANIFEST, SERVER_AJV_OPTIONS } from '../src/common/lazy-schema-compilers.js';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

/**
 * The servers compile route schemas without checking them against JSON Schema's meta-schema (that
 * check cost every process on its first request). It is made here instead, once, for
 * every schema a route validates with (routeSchemas: what the build precompiles).
 */
type AjvLike = { compile(schema: object): unknown; validateSchema(schema: object): boolean; errorsText(errors?: unknown): string; errors?: unknown };
const Ajv = (createRequire(import.meta.url)('ajv') as { default: new (opts: object) => AjvLike }).default;

describe('route schemas', () => {
  const all = routeSchemas();
  for (const module of ['admin', 'request-plane', 'openai-schema']) {
    it(`${module}: every exported schema is valid JSON Schema and compiles under ajv's default strict mode (the servers' options)`, () => {
      const schemas = all.filter((s) => s.module === module);
      assert.ok(schemas.length > 0, `${module} exports schemas`);
      for (const { name, schema } of schemas) {
        const ajv = new Ajv({ validateSchema: true, coerceTypes: false, removeAdditional: false });
        assert.equal(ajv.validateSchema(schema), true, `${module}.${name}: ${ajv.errorsText(ajv.errors)}`);
        assert.doesNotThrow(() => ajv.compile(schema), `${module}.${name} compiles`);
      }
    });
  }

  it('a schema that is not JSON Schema is caught here', () => {
    const ajv = new Ajv({ validateSchema: true });
    assert.equal(ajv.validateSchema({ type: 'objekt' }), false);
  });

  it('the build precompiled every one of them; the precompiled code answers as ajv does (verdict, errors, defaults)', () => {
    const manifest = JSON.parse(readFileSync(join(PRECOMPILED_DIR, PRECOMPILED_MANIFEST), 'utf8')) as Record<string, string>;
    for (const { module, name, schema } of all) assert.ok(manifest[JSON.stringify(schema)], `${module}.${name} precompiled (npm run build)`);
    const route = (schema: object) => ({ schema, method: 'POST', url: '/x', httpPart: 'body' });
    const ours = lazyValidators({}, { customOptions: {} } as never);
    const bodies: Array<[object, unknown]> = [
      [requestPlane.GenerateBodySchema, { model: 'm1', prompt: 'hi', max_tokens: 3 }],
      [requestPlane.GenerateBodySchema, { model: 'm1', max_tokens: 'many' }],
      [requestPlane.GenerateBodySchema, { prompt: 'no model' }],
      [admin.DrainBodySchema, { reason: 'x', deadline: 5 }],
      [openai.chatCompletionSchema, { model: 'm1', messages: [{ role: 'user', content: 'hi' }], n: 99 }],
    ];
    for (const [schema, body] of bodies) {
      const ajv = new Ajv({ ...SERVER_AJV_OPTIONS });
      const reference = ajv.compile(schema) as ((d: unknown) => boolean) & { errors?: unknown };
      const [a, b] = [structuredClone(body), structuredClone(body)];
      const validate = ours(route(schema)) as ((d: unknown) => boolean) & { errors?: unknown };
      assert.equal(validate(a), reference(b), JSON.stringify(body));
      assert.deepEqual(validate.errors ?? null, reference.errors ?? null, JSON.stringify(body));
      assert.deepEqual(a, b, 'the same defaults applied');
    }
  });
});
