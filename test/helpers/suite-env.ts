/**
 * The test suite's own environment, so that nothing a user runs on this machine meets a test.
 * `ebb up` and the operator commands find each other in the per-user runtime directory
 * ($XDG_RUNTIME_DIR/ebb, else <tmpdir>/ebb-<uid>): with a user's `npm start` running there, every
 * command a test ran without --frontend/--discovery saw two fleets and refused (or acted on the
 * user's). Each test file's process gets a runtime directory of its own (test files running side
 * by side do not meet either), and the user's EBB_* settings (EBB_DISCOVERY, EBB_ADMIN_TOKEN,
 * EBB_LOG_FORMAT...) are not the suite's: only EBB_TEST_*, the suite's own knobs, are kept.
 *
 * Imported for its effect, first, by processes.ts: every test that starts a process uses it.
 */
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const SUITE_RUNTIME_DIR = mkdtempSync(join(tmpdir(), 'ebb-test-runtime-'));

process.env.XDG_RUNTIME_DIR = SUITE_RUNTIME_DIR;
for (const name of Object.keys(process.env)) if (name.startsWith('EBB_') && !name.startsWith('EBB_TEST_')) delete process.env[name];

/**
 * Removes `dir` whole. `ebb up`'s worker and frontend (not this file's children: they stop on their
 * own once `ebb up` is gone) may still write discovery records in it while it is removed: a
 * directory that gained an entry fails with ENOTEMPTY, retried as rimraf does. On a loaded machine
 * they write for longer than the retries last, and rmSync stops at that directory (`ebb up`'s
 * `discovery-*`) before what sorts after it: the SIGKILLed `ebb up`'s state file, which nobody else
 * removes (seen in suite-isolation). Then every file is removed on its own (the writers remove
 * what they write after), and the error is still thrown for the caller to report.
 */
export function removeDirNow(dir: string): void {
  try {
    rmSync(dir, { recursive: true, force: true, maxRetries: 10, retryDelay: 20 });
  } catch (err) {
    for (const file of filesUnder(dir)) {
      try {
        rmSync(file, { force: true });
      } catch {
        /* a writer's own, changing under us: it removes it */
      }
    }
    throw err;
  }
}

/** Every file (not directory) under `dir` that can be listed now (none when it does not exist; a directory gone meanwhile has none). */
export function filesUnder(dir: string): string[] {
  let entries;
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch {
    return [];
  }
  return entries.flatMap((e) => (e.isDirectory() ? filesUnder(join(dir, e.name)) : [join(dir, e.name)]));
}

/** Removes the runtime directory (on the file's exit, once its children are killed: see reaper.ts). */
export function removeSuiteRuntimeDir(): void {
  removeDirNow(SUITE_RUNTIME_DIR);
}
