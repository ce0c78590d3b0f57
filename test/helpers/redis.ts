/**
 * A real, throwaway redis-server for tests (Debian's redis-server, installed by .ci/run): a free
 * loopback port, nothing saved to disk, readiness taken from its own "Ready to accept connections".
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { execFileSync } from 'node:child_process';
import { stablePort } from './ports.js';
import { bounded } from './processes.js';
import { dieWithFile } from './reaper.js';
import { skipWithout } from './required-tool.js';

export interface RedisServer {
  url: string;
  port: number;
  /** SIGKILL: the store gone at once (a crash, a network cut). */
  kill(): Promise<void>;
  stop(): Promise<void>;
  /** A crash and a restart on the same port: everything it held is gone. */
  restart(): Promise<void>;
  /** SIGSTOP / SIGCONT: a Redis that answers nothing (frozen), then answers again. */
  freeze(): void;
  thaw(): void;
}

export function redisSkipReason(): string | undefined {
  let available = true;
  try {
    execFileSync('redis-server', ['--version'], { stdio: 'ignore' });
  } catch {
    available = false;
  }
  return skipWithout(available, 'redis-server not installed: Redis stream-store tests SKIPPED; install redis-server');
}

/** redis-server on a free port (or `port`), its own extra arguments appended (a replica's, a password). */
export async function startRedis(args: string[] = [], port?: number): Promise<RedisServer> {
  const p = port ?? (await stablePort());
  let proc = await spawnRedis(p, args);
  const kill = async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      const exited = once(proc, 'exit');
      proc.kill('SIGKILL');
      await exited;
    }
  };
  return {
    url: `redis://127.0.0.1:${p}`,
    port: p,
    kill,
    stop: kill,
    restart: async () => {
      await kill();
      proc = await spawnRedis(p, args);
    },
    freeze: () => void proc.kill('SIGSTOP'),
    thaw: () => void proc.kill('SIGCONT'),
  };
}

export async function spawnRedis(port: number, args: string[], binary = 'redis-server', readyLine = 'Ready to accept connections'): Promise<ChildProcess> {
  const proc: ChildProcess = dieWithFile(spawn(binary, [...(binary === 'redis-server' ? ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'] : []), ...args], { stdio: ['ignore', 'pipe', 'pipe'] }));
  let output = '';
  const ready = new Promise<void>((resolve, reject) => {
    proc.stdout!.on('data', (d: Buffer) => {
      output += d.toString();
      if (output.includes(readyLine)) resolve();
    });
    proc.once('exit', (code) => reject(new Error(`${binary} exited (${code}) before it was ready: ${output}`)));
  });
  await bounded(ready, `${binary} on port ${port} to be ready`);
  return proc;
}

/**
 * How many scripts (EVAL, EVALSHA) a Redis ran to completion so far, from INFO commandstats: an
 * EVALSHA its client retried as EVAL (NOSCRIPT) counts once.
 */
export async function scriptsRun(admin: { info(section: string): Promise<string> }): Promise<number> {
  let n = 0;
  for (const m of (await admin.info('commandstats')).matchAll(/cmdstat_(?:evalsha|eval):calls=(\d+),.*?failed_calls=(\d+)/g)) n += Number(m[1]) - Number(m[2]);
  return n;
}
