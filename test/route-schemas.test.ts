import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import * as admin from '../src/protocol/admin.js';
import * as requestPlane from '../src/protocol/request-plane.js';
import * as openai from '../src/frontend/api/openai-schema.js';

/**
 * The servers compile route schemas without checking them against JSON Schema's meta-schema (that
 * check cost every process on its first request). It is made here instead, once, for
 * every schema a route validates with: those the protocol modules and the OpenAI schema module export.
 */
type AjvLike = { compile(schema: object): unknown; validateSchema(schema: object): boolean; errorsText(errors?: unknown): string; errors?: unknown };
const Ajv = (createRequire(import.meta.url)('ajv') as { default: new (opts: object) => AjvLike }).default;

describe('route schemas', () => {
  const modules: Record<string, Record<string, unknown>> = { admin, 'request-plane': requestPlane, 'openai-schema': openai };
  for (const [name, mod] of Object.entries(modules)) {
    it(`${name}: every exported schema is valid JSON Schema and compiles under ajv's default strict mode (the servers' options)`, () => {
      const schemas = Object.entries(mod).filter(([k, v]) => /schema$/i.test(k) && typeof v === 'object' && v !== null);
      assert.ok(schemas.length > 0, `${name} exports schemas`);
      for (const [k, schema] of schemas) {
        const ajv = new Ajv({ validateSchema: true, coerceTypes: false, removeAdditional: false });
        assert.equal(ajv.validateSchema(schema as object), true, `${name}.${k}: ${ajv.errorsText(ajv.errors)}`);
        assert.doesNotThrow(() => ajv.compile(schema as object), `${name}.${k} compiles`);
      }
    });
  }

  it('a schema that is not JSON Schema is caught here', () => {
    const ajv = new Ajv({ validateSchema: true });
    assert.equal(ajv.validateSchema({ type: 'objekt' }), false);
  });
});
