/**
 * Debian's nginx in front of frontends, configured from the repository's own
 * deploy/load-balancer/nginx.conf (its listen address and upstream servers replaced): what an
 * operator runs, on loopback. `setBackends` rewrites the upstream and reloads (a rolling restart).
 */
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { freePort } from '../../src/engine/engine-process.js';
import { bounded } from './processes.js';
import { dieWithFile } from './reaper.js';
import { skipWithout } from './required-tool.js';

const NGINX = ['/usr/sbin/nginx', 'nginx'];
const CONF = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'deploy', 'load-balancer', 'nginx.conf');

function nginxBinary(): string | undefined {
  for (const b of NGINX) {
    try {
      execFileSync(b, ['-v'], { stdio: 'ignore' });
      return b;
    } catch {
      // next
    }
  }
  return undefined;
}

export function nginxSkipReason(): string | undefined {
  return skipWithout(nginxBinary() !== undefined, 'nginx not installed: the load-balancer tests are SKIPPED; install nginx');
}

export interface Nginx {
  url: string;
  /** Points the upstream at these frontend ports and reloads (new connections go there; open ones finish where they are). */
  setBackends(ports: number[]): Promise<void>;
  stop(): Promise<void>;
}

export async function startNginx(backends: number[]): Promise<Nginx> {
  const binary = nginxBinary()!;
  const dir = mkdtempSync(join(tmpdir(), 'ebb-nginx-'));
  const port = await freePort();
  const template = readFileSync(CONF, 'utf8');
  const conf = join(dir, 'nginx.conf');
  const write = (ports: number[]) => {
    const servers = ports.map((p) => `        server 127.0.0.1:${p} max_fails=1 fail_timeout=5s;`).join('\n');
    const text = template
      .replace(/^worker_processes .*$/m, 'worker_processes 1;')
      .replace(/(upstream ebb_frontends \{\n)(?:\s*server [^\n]*\n)+/, `$1${servers}\n`)
      .replace(/listen 8080;/, `listen 127.0.0.1:${port};`);
    if (!text.includes(`listen 127.0.0.1:${port};`) || !text.includes(servers)) throw new Error('deploy/load-balancer/nginx.conf no longer has the listen and upstream lines this helper rewrites');
    writeFileSync(conf, text);
  };
  write(backends);
  const proc: ChildProcess = dieWithFile(spawn(binary, ['-p', dir, '-c', conf, '-g', `daemon off; pid ${join(dir, 'nginx.pid')}; error_log ${join(dir, 'error.log')} notice;`], { stdio: ['ignore', 'ignore', 'pipe'] }));
  let stderr = '';
  proc.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const exited = once(proc, 'exit');
  await bounded(
    (async () => {
      for (;;) {
        if (proc.exitCode !== null) throw new Error(`nginx exited at start: ${stderr}`);
        if (await accepts(port)) return;
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    })(),
    `nginx on port ${port} to accept`,
  );
  return {
    url: `http://127.0.0.1:${port}`,
    async setBackends(ports) {
      write(ports);
      // A reload starts new workers with the new upstream (its error log says so) and lets the old ones finish their connections.
      const started = () => (readFileSync(join(dir, 'error.log'), 'utf8').match(/start worker process/g) ?? []).length;
      const before = started();
      execFileSync(binary, ['-p', dir, '-c', conf, '-g', `pid ${join(dir, 'nginx.pid')};`, '-s', 'reload']);
      await bounded(
        (async () => {
          while (started() === before) await new Promise((resolve) => setTimeout(resolve, 20));
        })(),
        'nginx to start workers with the new upstream',
      );
    },
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill('SIGTERM');
        await exited;
      }
    },
  };
}

function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect(port, '127.0.0.1');
    s.once('connect', () => (s.destroy(), resolve(true)));
    s.once('error', () => resolve(false));
  });
}
