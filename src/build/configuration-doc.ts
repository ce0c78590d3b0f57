/**
 * `npm run docs`: writes docs/configuration.md, the flag reference, from the CLI's own definitions
 * (src/cli/flag-reference.ts). With --check it writes nothing and exits 1 when the page is stale.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { packageFile } from '../common/package-files.js';
import { renderConfiguration } from '../cli/flag-reference.js';

const PAGE = packageFile('docs', 'configuration.md');
const page = await renderConfiguration();
let current = '';
try {
  current = readFileSync(PAGE, 'utf8');
} catch {
  /* not written yet */
}
if (process.argv.includes('--check')) {
  if (current !== page) {
    process.stderr.write(`${PAGE} is stale: run npm run docs\n`);
    process.exit(1);
  }
} else if (current !== page) {
  writeFileSync(PAGE, page);
  process.stdout.write(`wrote ${PAGE}\n`);
}
