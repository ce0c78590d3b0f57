/**
 * A real, throwaway redis-server for tests (Debian's redis-server, installed by .ci/run): a free
 * loopback port, nothing saved to disk, readiness taken from its own "Ready to accept connections".
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { execFileSync } from 'node:child_process';
import { freePort } from '../../src/engine/engine-process.js';
import { bounded } from './processes.js';
import { dieWithFile } from './reaper.js';
import { skipWithout } from './required-tool.js';

export interface RedisServer {
  url: string;
  /** SIGKILL: the store gone at once (a crash, a network cut). */
  kill(): Promise<void>;
  stop(): Promise<void>;
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

export async function startRedis(): Promise<RedisServer> {
  const port = await freePort();
  const proc: ChildProcess = dieWithFile(spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: ['ignore', 'pipe', 'pipe'] }));
  let output = '';
  const ready = new Promise<void>((resolve, reject) => {
    proc.stdout!.on('data', (d: Buffer) => {
      output += d.toString();
      if (output.includes('Ready to accept connections')) resolve();
    });
    proc.once('exit', (code) => reject(new Error(`redis-server exited (${code}) before it was ready: ${output}`)));
  });
  await bounded(ready, `redis-server on port ${port} to be ready`);
  const exited = once(proc, 'exit');
  const kill = async () => {
    if (proc.exitCode === null && proc.signalCode === null) {
      proc.kill('SIGKILL');
      await exited;
    }
  };
  return { url: `redis://127.0.0.1:${port}`, kill, stop: kill };
}
