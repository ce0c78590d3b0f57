/**
 * Build step (after tsc): the `ebb` program as one bundle, dist/bin/ebb.js, plus the chunks its
 * commands load lazily. Node resolves and reads each module file apart, about 300 files for a
 * worker (fastify, undici, ebb's own), and system calls are dear. Bundled, a worker reaches ready
 * on about a third less CPU, a frontend too (bench/process-start.ts, docs/benchmarks.md).
 * tsc still type-checks and compiles; this only joins its output. Packages that load native code or
 * files of their own by path at run time stay outside, resolved from node_modules as before.
 * Only files whose bytes changed are written (a rebuild of a current tree touches nothing, so a
 * running process never loads a half-written chunk), and chunks no longer produced are removed.
 */
import { build } from 'esbuild';
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { packageFile } from '../common/package-files.js';

const BUNDLE_DIR = packageFile('dist', 'bin');

/** Native code, or files read from the package's own directory at run time. */
const EXTERNAL = ['zeromq', 'node-llama-cpp', 'etcd3', 'pino', 'pino-pretty', 'msgpackr'];

const result = await build({
  entryPoints: { ebb: packageFile('dist', 'src', 'cli', 'main.js') },
  outdir: BUNDLE_DIR,
  bundle: true,
  splitting: true,
  format: 'esm',
  platform: 'node',
  target: 'node20',
  external: EXTERNAL,
  write: false,
  logLevel: 'warning',
  legalComments: 'none',
  // The CommonJS packages inside call require() for Node's modules; an ES module has none of its own.
  banner: { js: "import { createRequire as __ebbCreateRequire } from 'node:module'; const require = __ebbCreateRequire(import.meta.url);" },
});

mkdirSync(BUNDLE_DIR, { recursive: true });
const produced = new Set<string>();
for (const file of result.outputFiles) {
  const name = basename(file.path);
  produced.add(name);
  let current: Buffer | undefined;
  try {
    current = readFileSync(file.path);
  } catch {
    current = undefined;
  }
  if (current !== undefined && Buffer.compare(current, file.contents) === 0) continue;
  // Whole or not at all: a process starting now reads the old file or the new one.
  const tmp = `${file.path}.${process.pid}.tmp`;
  writeFileSync(tmp, file.contents, { mode: name === 'ebb.js' ? 0o755 : 0o644 });
  renameSync(tmp, file.path);
}
for (const name of readdirSync(BUNDLE_DIR)) if (!produced.has(name)) rmSync(join(BUNDLE_DIR, name), { force: true });
