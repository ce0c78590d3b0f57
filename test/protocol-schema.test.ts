import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const PROTOCOL = join(dirname(fileURLToPath(import.meta.url)), '..', 'src', 'protocol');

/**
 * The protocol builds its JSON Schemas with src/protocol/schema.ts (TypeBox's signatures, not its
 * runtime, which costs every process start). Each protocol module is evaluated a second time with
 * TypeBox itself in place of those builders: every schema it exports must come out the same.
 */
describe('protocol schemas', () => {
  for (const name of ['admin', 'request-plane']) {
    it(`${name}: every exported schema equals what TypeBox builds from the same definition`, async () => {
      const ours = (await import(join(PROTOCOL, `${name}.js`))) as Record<string, unknown>;
      const source = readFileSync(join(PROTOCOL, `${name}.js`), 'utf8');
      const swapped = source.replace(/import \{ Type \} from '\.\/schema\.js';/, "import Type from 'typebox';");
      assert.notEqual(swapped, source, 'the module imports the builders as expected');
      const copy = join(PROTOCOL, `.typebox-check-${process.pid}-${name}.js`);
      writeFileSync(copy, swapped);
      let theirs: Record<string, unknown>;
      try {
        theirs = (await import(copy)) as Record<string, unknown>;
      } finally {
        rmSync(copy, { force: true });
      }
      const schemas = Object.keys(ours).filter((k) => k.endsWith('Schema'));
      assert.ok(schemas.length > 0);
      for (const k of schemas) assert.equal(JSON.stringify(ours[k]), JSON.stringify(theirs[k]), k);
    });
  }
});
