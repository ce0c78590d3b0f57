/**
 * docs/configuration.md is the flag reference, generated from the CLI's own commander definitions
 * (npm run docs). Other work adds flags: this fails the moment the page and the CLI disagree.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { renderConfiguration } from '../src/cli/flag-reference.js';
import { COMMANDS } from '../src/cli/program.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

describe('docs/configuration.md', () => {
  it('is what the CLI defines now, every command and flag (npm run docs writes it)', async () => {
    const page = readFileSync(join(ROOT, 'docs', 'configuration.md'), 'utf8');
    const want = await renderConfiguration();
    if (page !== want) {
      const [a, b] = [page.split('\n'), want.split('\n')];
      const at = a.findIndex((line, i) => line !== b[i]);
      assert.fail(`docs/configuration.md is stale: run npm run docs. First difference, line ${at + 1}:\n  page: ${a[at] ?? '(end)'}\n  CLI:  ${b[at] ?? '(end)'}`);
    }
    for (const name of Object.keys(COMMANDS)) assert.ok(page.includes(`## \`ebb ${name}\``), `a section for ebb ${name}`);
    assert.match(page, /\| `--shutdown-timeout-ms <n>` \| `300000` \|/, 'a flag, with its default');
  });
});
