/**
 * Every process a test file starts dies with the file: when it ends (its 'exit', however it
 * failed), when the test runner cancels it at --test-timeout (a SIGTERM, and node:test's file
 * processes have no handler of their own: without one here the file died and left every child
 * running, for as long as nobody looked), on Ctrl-C or a hang-up. A file that is SIGKILLed runs
 * nothing: its ebb processes then stop on their own, as under `ebb up`, when their IPC channel to
 * it closes (see spawnEbb), and `ebb up` stops the workers it started.
 */
import type { ChildProcess } from 'node:child_process';
import { constants } from 'node:os';
import { removeSuiteRuntimeDir } from './suite-env.js';

const children = new Set<ChildProcess>();

/** `child` is killed with this process (see above); returned as it is. */
export function dieWithFile<T extends ChildProcess>(child: T): T {
  children.add(child);
  child.once('exit', () => children.delete(child));
  return child;
}

/** SIGKILLs every child still running; synchronous, so it also works from process 'exit'. */
export function killAllNow(): void {
  for (const child of children) child.kill('SIGKILL');
}

process.on('exit', () => {
  killAllNow();
  removeSuiteRuntimeDir();
});
for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) {
  process.on(signal, () => {
    // Another listener (a bench's own cleanup) owns the signal: its exit runs the hook above.
    if (process.listenerCount(signal) > 1) return;
    killAllNow();
    process.exit(128 + constants.signals[signal]);
  });
}
