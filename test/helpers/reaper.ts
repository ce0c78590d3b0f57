/**
 * Every process a test file starts dies with the file, and the data it leaves is removed: when the
 * file ends (its 'exit', however it failed), when the test runner cancels it at --test-timeout (a
 * SIGTERM, and node:test's file processes have no handler of their own: without one here the file
 * died and left every child running, for as long as nobody looked), on Ctrl-C or a hang-up. A file
 * that is SIGKILLed runs nothing: its ebb processes then stop on their own, as under `ebb up`, when
 * their IPC channel to it closes (see spawnEbb), and `ebb up` stops the workers it started.
 */
import type { ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { constants } from 'node:os';
import { removeDirNow, removeSuiteRuntimeDir } from './suite-env.js';

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

const dirs = new Set<string>();

/** `dir` (a child's data: an etcd's is over 100 MB) is removed at this process's exit, once the children are killed. */
export function removeWithFile(dir: string): string {
  dirs.add(dir);
  return dir;
}

/** Whether process `pid` can still run (not gone, not a zombie): a SIGKILL is delivered, not done, when kill() returns. */
function running(pid: number): boolean {
  try {
    return !/^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'latin1'));
  } catch {
    return false; // gone (or no /proc: nothing to wait on)
  }
}

/** Waits (synchronously, bounded) until every child SIGKILLed is dead: none writes into a directory removed after. */
function awaitDeaths(pids: number[], boundMs = 2_000): void {
  const until = Date.now() + boundMs;
  while (pids.some(running) && Date.now() < until) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 5);
}

process.on('exit', () => {
  const pids = [...children].flatMap((c) => (c.pid === undefined ? [] : [c.pid]));
  killAllNow();
  // A child killed mid-write (ebb up recording its fleet) would put a file back into its runtime directory.
  awaitDeaths(pids);
  // Each tried whatever the last did: one that cannot be removed must not keep the others.
  for (const remove of [...[...dirs].map((dir) => () => removeDirNow(dir)), removeSuiteRuntimeDir]) {
    try {
      remove();
    } catch (err) {
      process.stderr.write(`test cleanup: ${(err as Error).message}\n`);
    }
  }
});
for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) {
  process.on(signal, () => {
    // Another listener (a bench's own cleanup) owns the signal: its exit runs the hook above.
    if (process.listenerCount(signal) > 1) return;
    killAllNow();
    process.exit(128 + constants.signals[signal]);
  });
}
