/**
 * A new user's first commands: `npm start` does not recompile a current build, the tests' tiny
 * model can be written with one command and loads in a llama-cpp worker, and `ebb up` refusing its
 * flags leaves nothing behind.
 */
import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { spawnEbb, startWorker, tempDiscoveryUrl, type EbbProcess } from './helpers/processes.js';

const run = promisify(execFile);
const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const started: EbbProcess[] = [];
after(async () => {
  await Promise.all(started.map((p) => p.terminate()));
});

describe('first run: tools', () => {
  it('npm run build (what npm start runs first) writes nothing when dist is current', async () => {
    await run('npm', ['run', 'build', '--silent'], { cwd: ROOT, timeout: 280_000 }); // current from here on
    // tsc's output, the bundle every test process runs (a chunk rewritten under them could be read
    // half-written), and the precompiled validators they load on a route's first request (a test
    // beside this one met one missing while the build refilled their directory).
    const bundle = join(ROOT, 'dist', 'bin');
    const validators = join(ROOT, 'dist', 'src', 'build', 'validators');
    const chunks = readdirSync(bundle).map((f) => join(bundle, f));
    const compiled = readdirSync(validators).map((f) => join(validators, f));
    const files = [join(ROOT, 'dist', 'src', 'cli', 'main.js'), ...chunks, ...compiled];
    assert.ok(chunks.length > 1, 'the bundle has its chunks');
    assert.ok(compiled.length > 1, 'the validators are precompiled');
    const before = files.map((f) => statSync(f).mtimeMs);
    await run('npm', ['run', 'build', '--silent'], { cwd: ROOT, timeout: 280_000 });
    assert.deepEqual(files.map((f) => statSync(f).mtimeMs), before, 'no file was rewritten');
    assert.deepEqual(readdirSync(bundle).map((f) => join(bundle, f)), chunks, 'no chunk added or removed');
    assert.deepEqual(readdirSync(validators).map((f) => join(validators, f)), compiled, 'no validator added or removed');
  });

  it('make-test-model writes a GGUF a llama-cpp worker loads and serves', async () => {
    const file = join(mkdtempSync(join(tmpdir(), 'ebb-model-')), 'tiny.gguf');
    const made = await run(process.execPath, [join(ROOT, 'dist', 'test', 'helpers', 'make-test-model.js'), file]);
    assert.match(made.stdout, /^wrote .*tiny\.gguf/);
    // --gpu auto (the default): the worker says which backend it chose and, for the CPU, why.
    const w = await startWorker(['--engine', 'llama-cpp', '--model-path', file, '--gpu', 'auto', '--threads', '1', '--discovery', tempDiscoveryUrl()]);
    started.push(w);
    assert.equal((await w.waitForEvent('worker_ready')).model, 'tiny');
    const backend = await w.waitForEvent('llama_backend');
    assert.equal(backend.requested, 'auto');
    if (backend.backend === 'cpu') assert.match(String(backend.msg), /^llama\.cpp runs on the CPU: --gpu auto fell back, (no GPU backend has its libraries|the .* binary did not load)/);
    else assert.match(String(backend.msg), new RegExp(`^llama\\.cpp runs on ${String(backend.backend)}: --gpu auto found`));
  });

  it('ebb up refusing its flags leaves no temporary discovery directory', async () => {
    const runtime = mkdtempSync(join(tmpdir(), 'ebb-runtime-'));
    const up = spawnEbb(['up', '--engine', 'llama-cpp'], 'ebb up', { XDG_RUNTIME_DIR: runtime });
    started.push(up);
    assert.equal(await up.exitCode(), 1);
    assert.match(up.stderr.join('\n'), /--engine llama-cpp needs --model-path/);
    const dir = join(runtime, 'ebb');
    assert.deepEqual(existsSync(dir) ? readdirSync(dir) : [], [], 'nothing left in the runtime directory');
  });
});

