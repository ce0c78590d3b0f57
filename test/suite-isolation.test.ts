/**
 * The suite meets nothing a user runs on the machine, and leaves nothing running. A test file
 * (helpers/fleet-file.ts, run as node --test runs each file, with `npm test`'s flags, in the
 * environment of a user whose own `ebb up` runs) starts an `ebb up` and a worker: an operator
 * command it runs without flags sees only its fleet; and once it is cancelled at its timeout,
 * SIGKILLed, or fails, none of its ebb processes, the `ebb up`'s workers included, is left running
 * (nor, but where it was SIGKILLed, its etcd, the etcd's data and its runtime directory).
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { setTimeout as delay } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { REPORT_PREFIX, type FleetFileReport } from './helpers/fleet-file-report.js';
import { bounded, spawnEbb, START_BOUND_MS, type EbbProcess } from './helpers/processes.js';
import { dieWithFile } from './helpers/reaper.js';
import { filesUnder } from './helpers/suite-env.js';

const here = dirname(fileURLToPath(import.meta.url));
const FLEET_FILE = join(here, 'helpers', 'fleet-file.js');
/** `npm test`'s runner flags (its --test-timeout, --test-force-exit), not its concurrency. */
const SUITE_FLAGS = (JSON.parse(readFileSync(join(here, '..', '..', 'package.json'), 'utf8')) as { scripts: { test: string } }).scripts.test
  .split(/\s+/)
  .filter((a) => a.startsWith('--test-') && !a.startsWith('--test-concurrency'));
/** Where the user's own `ebb up` runs: the runtime directory a test file would find by default. */
const userRuntime = mkdtempSync(join(tmpdir(), 'ebb-user-runtime-'));

/** Whether `pid` runs (a zombie has exited; it only waits to be reaped). */
function running(pid: number): boolean {
  if (!existsSync('/proc')) {
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat[stat.lastIndexOf(')') + 2] !== 'Z';
  } catch {
    return false;
  }
}

const commandOf = (pid: number) => {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ').trim();
  } catch {
    return '?';
  }
};

/**
 * Resolves once none of `pids` runs. They are the fleet file's processes and its children's, not
 * this process's children: no exit event reaches here, so they are looked up until gone.
 */
async function allGone(pids: number[], what: string, boundMs = 30_000): Promise<void> {
  const deadline = Date.now() + boundMs;
  for (let left = pids.filter(running); left.length > 0; left = pids.filter(running)) {
    if (Date.now() > deadline) throw new Error(`timed out: ${what}; still running: ${left.map((p) => `${p} (${commandOf(p)})`).join(', ')}`);
    await delay(100);
  }
}

/**
 * The fleet file as node --test runs each test file (its process: `node <npm test's flags> FILE`),
 * in the user's environment; resolves with its report.
 */
async function runFleetFile(end: 'cancel' | 'kill' | 'fail'): Promise<{ report: FleetFileReport; file: ChildProcess; exited: Promise<unknown>; output: string[] }> {
  const file = dieWithFile(
    spawn(process.execPath, [...SUITE_FLAGS, FLEET_FILE], {
      // NODE_TEST_CONTEXT: this file's own, from its runner; the fleet file reports to nobody.
      env: { ...process.env, NODE_TEST_CONTEXT: undefined, XDG_RUNTIME_DIR: userRuntime, EBB_TEST_FLEET_FILE_END: end },
      stdio: ['ignore', 'pipe', 'pipe'],
    }),
  );
  const output: string[] = [];
  file.stderr.setEncoding('utf8').on('data', (d: string) => output.push(d));
  const exited = once(file, 'exit');
  const report = await bounded(
    new Promise<FleetFileReport>((resolve, reject) => {
      createInterface({ input: file.stdout }).on('line', (line) => {
        output.push(line);
        if (line.startsWith(REPORT_PREFIX)) resolve(JSON.parse(line.slice(REPORT_PREFIX.length)) as FleetFileReport);
      });
      file.once('exit', () => reject(new Error(`the fleet file ended before its report:\n${output.join('\n')}`)));
    }),
    'the fleet file to report what it started',
    START_BOUND_MS * 2,
  );
  started.push(...report.ebb, ...report.tools);
  return { report, file, exited, output };
}

/** Every process a fleet file reported: stopped after the tests, should one of them fail. */
const started: number[] = [];

let userUp: EbbProcess;
before(async () => {
  userUp = spawnEbb(['up', '--port', '0', '--workers', '1', '--mocker-itl-ms', '0'], "the user's ebb up", { XDG_RUNTIME_DIR: userRuntime });
  await userUp.waitForStderr(/ebb is up/, START_BOUND_MS);
});
after(async () => {
  for (const pid of started) if (running(pid)) process.kill(pid, 'SIGKILL');
  await userUp?.terminate();
  rmSync(userRuntime, { recursive: true, force: true });
});


describe('the suite and the machine it runs on', () => {
  it("a test file cancelled at its timeout leaves nothing running, nor its runtime and etcd directories; its operator commands see its own fleet, not the user's", async () => {
    const { report, file, exited, output } = await runFleetFile('cancel');
    assert.equal(report.listed.code, 0, `ebb workers in the test file met the user's fleet: ${report.listed.stderr}`);
    const listed = (JSON.parse(report.listed.stdout) as { workers: Array<{ worker_id: string }> }).workers.map((w) => w.worker_id);
    assert.deepEqual(listed, [report.upWorker], "the test file's own `ebb up` fleet, nothing of the user's");
    // What node --test does to a file past --test-timeout.
    file.kill('SIGTERM');
    await bounded(exited, 'the cancelled file to exit').catch((err: Error) => assert.fail(`${err.message}\n${output.join('\n')}`));
    await allGone([...report.ebb, ...report.tools], 'every process of the cancelled file to exit');
    for (const dir of report.toolDirs) assert.equal(existsSync(dir), false, `${dir} is removed`);
    // As below: `ebb up`'s worker and frontend stop on their own after the file removed its runtime directory, and may make its (empty) directories again, never leave a file.
    assert.deepEqual(filesUnder(report.runtimeDir), [], `${report.runtimeDir} holds no file`);
    rmSync(report.runtimeDir, { recursive: true, force: true });
  });

  it('a test file SIGKILLed leaves no ebb process running: they stop when their IPC channel to it closes', async () => {
    const { report, file } = await runFleetFile('kill');
    file.kill('SIGKILL');
    await allGone(report.ebb, 'every ebb process of the SIGKILLed file to exit');
    rmSync(report.runtimeDir, { recursive: true, force: true }); // a SIGKILLed file runs no code: nothing removes it
  });

  it('a test file that fails with its processes running ends at once, and leaves nothing running', async () => {
    const { report, exited, output } = await runFleetFile('fail');
    await bounded(exited, 'the failed file to exit (its processes still running)').catch((err: Error) => assert.fail(`${err.message}\n${output.join('\n')}`));
    await allGone([...report.ebb, ...report.tools], 'every process of the failed file to exit');
    for (const dir of report.toolDirs) assert.equal(existsSync(dir), false, `${dir} is removed`);
    // `ebb up`'s worker and frontend shut down on their own once it is gone, after the file removed the
    // runtime directory: their discovery may make its (empty) directories again, never leave a file there.
    assert.deepEqual(filesUnder(report.runtimeDir), [], `${report.runtimeDir} holds no file`);
    rmSync(report.runtimeDir, { recursive: true, force: true });
  });
});
