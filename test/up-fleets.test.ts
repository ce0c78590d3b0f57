/**
 * Several `ebb up` fleets of one user on one machine: each says what it runs in a file of its own;
 * the operator commands without flags use the one running, refuse to guess among several (listing
 * them, asking for --fleet) but need none for a worker given by its URL, ignore and remove the file
 * of a fleet that was killed; a fleet that stops removes only its own file.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runEbb, spawnEbb, type EbbProcess } from './helpers/processes.js';

const runtime = mkdtempSync(join(tmpdir(), 'ebb-runtime-'));
const env = { XDG_RUNTIME_DIR: runtime, EBB_DISCOVERY: undefined, EBB_ADMIN_TOKEN: undefined };
const ebb = (...args: string[]) => runEbb(args, env, 60_000);
const stateFile = (name: string) => join(runtime, 'ebb', `up-${name}.json`);

interface Fleet {
  up: EbbProcess;
  adminUrl: string;
  /** Its one worker: id and system URL, from the banner. */
  worker: { id: string; url: string };
}

async function startUp(name?: string): Promise<Fleet> {
  const up = spawnEbb(['up', '--workers', '1', '--port', '0', '--admin-port', '0', '--mocker-itl-ms', '0', ...(name === undefined ? [] : ['--name', name])], `ebb up ${name ?? ''}`, env);
  const [, adminUrl] = await up.waitForStderr(/Fleet admin:\s+(\S+)\/workers/);
  const [, id, url] = await up.waitForStderr(/worker (\S+): admin (\S+)/);
  return { up, adminUrl: adminUrl!, worker: { id: id!, url: url! } };
}

const workerIds = async (args: string[]) => {
  const r = await ebb('workers', '--json', ...args);
  assert.equal(r.code, 0, r.stderr);
  return (JSON.parse(r.stdout) as { workers: Array<{ worker_id: string }> }).workers.map((w) => w.worker_id);
};

let a: Fleet;
let b: Fleet;
before(async () => {
  [a, b] = await Promise.all([startUp('alpha'), startUp()]);
});
after(async () => {
  await Promise.all([a?.up.terminate(), b?.up.terminate()]);
});

describe('several `ebb up` fleets', () => {
  it('each has its own state file; a command without flags refuses to guess and lists them; --fleet picks one', async () => {
    assert.ok(existsSync(stateFile('alpha')), 'the named fleet has up-alpha.json');
    assert.ok(existsSync(stateFile(String(b.up.pid))), "the unnamed one's file is named by its pid");
    const guess = await ebb('workers');
    assert.notEqual(guess.code, 0, `two fleets run: "ebb workers" must not pick one; it said: ${guess.stdout}`);
    assert.match(guess.stderr, /--fleet NAME/);
    assert.match(guess.stderr, /alpha \(http:/);
    assert.match(guess.stderr, new RegExp(`${b.up.pid} \\(http:`));
    const alpha = await workerIds(['--fleet', 'alpha']);
    const other = await workerIds(['--fleet', String(b.up.pid)]);
    assert.equal(alpha.length, 1);
    assert.equal(other.length, 1);
    assert.notDeepEqual(alpha, other, 'each --fleet reads its own fleet');
    assert.deepEqual(alpha, await workerIds(['--frontend', a.adminUrl]), '--fleet alpha is the fleet at its admin URL');
    const unknown = await ebb('workers', '--fleet', 'nope');
    assert.notEqual(unknown.code, 0);
    assert.match(unknown.stderr, /no `ebb up` named "nope" is running; running: .*alpha \(/);
  });

  it("a worker given by its system URL is acted on directly, with no --fleet: status, drain --wait, resume, prestop", async () => {
    const { id, url } = b.worker;
    const status = await ebb('status', url);
    assert.equal(status.code, 0, `ebb status URL looked for a fleet: ${status.stderr}`);
    assert.match(status.stdout, new RegExp(`^worker ${id}: serving`));
    const drain = await ebb('drain', url, '--wait', '--timeout', '30s');
    assert.equal(drain.code, 0, drain.stderr);
    assert.match(drain.stdout, new RegExp(`^worker ${id} drained in`));
    const resume = await ebb('resume', url);
    assert.equal(resume.code, 0, resume.stderr);
    assert.match(resume.stdout, new RegExp(`^worker ${id}: serving`));
    const prestop = await ebb('prestop', '--system-url', url, '--timeout', '30s');
    assert.equal(prestop.code, 0, prestop.stderr);
    assert.match(prestop.stdout, new RegExp(`^worker ${id} drained in`));
    assert.equal((await ebb('resume', url)).code, 0, 'back in rotation for the tests below');
  });

  it('a second fleet of a name that runs is refused', async () => {
    const dup = await ebb('up', '--workers', '1', '--port', '0', '--admin-port', '0', '--name', 'alpha');
    assert.notEqual(dup.code, 0);
    assert.match(dup.stderr, /a fleet named "alpha" is already running/);
    assert.ok(existsSync(stateFile('alpha')), "the refused one left alpha's file alone");
  });

  it("a killed fleet's file is ignored and removed", async () => {
    const gone = spawn(process.execPath, ['-e', '']);
    await once(gone, 'exit');
    mkdirSync(join(runtime, 'ebb'), { recursive: true });
    writeFileSync(stateFile('ghost'), JSON.stringify({ name: 'ghost', pid: gone.pid, discovery: 'file:///nowhere', frontend_url: 'http://127.0.0.1:9', admin_url: 'http://127.0.0.1:9' }));
    const guess = await ebb('workers');
    assert.doesNotMatch(guess.stderr, /ghost/, 'a dead fleet is not listed');
    assert.equal(existsSync(stateFile('ghost')), false, 'its file is removed');
  });

  it('a fleet that stops removes only its own file; the commands then find the one still running', async () => {
    a.up.signal('SIGTERM');
    assert.equal(await a.up.exitCode(), 0);
    assert.equal(existsSync(stateFile('alpha')), false, "alpha's file is gone");
    assert.ok(existsSync(stateFile(String(b.up.pid))), "the other fleet's file is still there");
    const left = await ebb('workers');
    assert.equal(left.code, 0, left.stderr);
    assert.deepEqual(await workerIds([]), await workerIds(['--frontend', b.adminUrl]), 'without flags: the one fleet still running');
  });
});
