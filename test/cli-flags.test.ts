/**
 * Flags a new user gets wrong are refused at parse time, naming the form expected, and the help
 * says each default once.
 */
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { CLI } from './helpers/processes.js';

const ebb = (args: string[]) => spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8', timeout: 30_000, env: { ...process.env, EBB_LOG_FORMAT: 'json' } });

describe('flags', () => {
  it('a port out of range is refused before anything starts', () => {
    for (const args of [['worker', '--port', '99999'], ['worker', '--system-port', '-1'], ['frontend', '--admin-port', '70000'], ['up', '--port', '99999']]) {
      const res = ebb(args);
      assert.notEqual(res.status, 0, args.join(' '));
      assert.match(res.stderr, /expected a port, an integer from 0 to 65535 \(0 = any free port\), got "-?\d+"/, args.join(' '));
      assert.equal(res.stdout, '', `${args.join(' ')}: nothing started, nothing logged`);
    }
  });

  it('ebb up --admin-host off loopback without an admin token is refused before anything starts', () => {
    const res = spawnSync(process.execPath, [CLI, 'up', '--port', '0', '--admin-host', '0.0.0.0'], { encoding: 'utf8', timeout: 30_000, env: { ...process.env, EBB_LOG_FORMAT: 'json', EBB_ADMIN_TOKEN: '' } });
    assert.notEqual(res.status, 0);
    assert.match(res.stderr, /refusing to serve the admin API on non-loopback address 0\.0\.0\.0 \(--admin-host\) without an admin token/);
    assert.doesNotMatch(res.stdout, /worker_ready|frontend_ready/, 'nothing started');
  });

  it('file://relative/dir is refused with the absolute form to use', () => {
    for (const cmd of [['worker'], ['frontend'], ['up'], ['workers']]) {
      const res = ebb([...cmd, '--discovery', 'file://relative/dir']);
      assert.notEqual(res.status, 0, cmd[0]);
      assert.match(res.stderr, /a file discovery URL takes an absolute path after three slashes, like file:\/\/\/tmp\/ebb-discovery; "file:\/\/relative\/dir" names the host "relative"/, cmd[0]);
    }
    assert.match(ebb(['worker', '--discovery', 'http://x']).stderr, /expected memory:, file:\/\/\/absolute\/dir or etcd:\/\/host:2379/);
  });

  it('--help states each default once, and no empty one', () => {
    for (const cmd of ['worker', 'frontend', 'up', 'workers', 'status', 'drain', 'resume', 'rollout', 'prestop']) {
      const help = ebb([cmd, '--help']).stdout;
      // One block per option: its first line starts with "  -", continuation lines are indented further.
      const blocks = help.split('\n').reduce<string[]>((all, line) => {
        if (/^ {2}-/.test(line)) all.push(line.trim());
        else if (all.length > 0 && /^ {4,}\S/.test(line)) all[all.length - 1] += ` ${line.trim()}`;
        return all;
      }, []);
      for (const b of blocks) {
        assert.doesNotMatch(b, /\(default: (\[\]|""|undefined)\)/, `ebb ${cmd}: an empty default: ${b}`);
        if (b.includes('(default:')) assert.equal(b.match(/\(default[ :]/g)?.length, 1, `ebb ${cmd}: the default said twice: ${b}`);
      }
    }
  });
});
