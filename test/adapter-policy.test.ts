import { describe, it, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AdapterPolicy } from '../src/worker/adapter-policy.js';
import { EbbError } from '../src/protocol/errors.js';

/** The admin load policy on this machine's files (llama-cpp's): real directories, files and symlinks. */
const root = mkdtempSync(join(tmpdir(), 'ebb-adapter-policy-'));
after(() => rmSync(root, { recursive: true, force: true }));
const dir = join(root, 'adapters');
mkdirSync(dir);
writeFileSync(join(dir, 'a.gguf'), 'x');
const secret = join(root, 'secret.gguf');
writeFileSync(secret, 'x');
symlinkSync(secret, join(dir, 'escape.gguf'));
mkdirSync(join(root, 'adapters-evil'));
writeFileSync(join(root, 'adapters-evil', 'b.gguf'), 'x');

const policy = new AdapterPolicy({ model: 'tiny', dirs: [dir], files: 'local' });
const refused = (code: string) => (err: unknown) => err instanceof EbbError && err.code === code;

describe('adapter load policy: files on this machine', () => {
  it('reads under --lora-dir, and an adapter from its own path, even outside it', async () => {
    await policy.check({ name: 'a', path: join(dir, 'a.gguf') }, undefined);
    await policy.check({ name: 'a', path: join(dir, '.', 'sub', '..', 'a.gguf') }, undefined);
    await policy.check({ name: 'n', path: join(dir, 'not-yet.gguf') }, undefined); // the engine's load says "no such file"
    await policy.check({ name: 's', path: secret }, { name: 's', path: secret });
    await policy.check({ name: 's' }, { name: 's', path: secret });
  });

  it('refuses a symlink out of it, .. out of it, a sibling sharing its prefix, and the directory itself', async () => {
    for (const path of [join(dir, 'escape.gguf'), join(dir, '..', 'secret.gguf'), join(root, 'adapters-evil', 'b.gguf'), dir, '/etc/passwd'])
      await assert.rejects(policy.check({ name: 'x', path }, undefined), refused('forbidden'), path);
  });

  it("refuses a new adapter without a path, a bad name, and the model's name", async () => {
    await assert.rejects(policy.check({ name: 'x' }, undefined), refused('invalid_request'));
    await assert.rejects(policy.check({ name: '../x', path: join(dir, 'a.gguf') }, undefined), refused('invalid_request'));
    await assert.rejects(policy.check({ name: 'tiny', path: join(dir, 'a.gguf') }, undefined), refused('invalid_request'));
  });
});
