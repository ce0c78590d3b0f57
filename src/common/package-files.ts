import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/**
 * Files the package ships beside its code (the dashboard page, the precompiled validators), found
 * from the package's root: the code runs from tsc's output (dist/src/...) or from the bundle
 * (dist/bin/, see src/build/bundle.ts), at different depths, so a path relative to a module breaks.
 */
function packageRoot(from: string): string {
  for (let dir = from; ; ) {
    if (existsSync(join(dir, 'package.json'))) return dir;
    const up = dirname(dir);
    if (up === dir) throw new Error(`ebb: no package.json in ${from} or above it`);
    dir = up;
  }
}

const PACKAGE_ROOT = packageRoot(dirname(fileURLToPath(import.meta.url)));

export const packageFile = (...parts: string[]): string => join(PACKAGE_ROOT, ...parts);
