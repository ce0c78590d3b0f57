/**
 * Starts a real, throwaway single-member etcd for tests: free loopback ports, a temporary data
 * directory, readiness taken from etcd's own "ready to serve client requests" log line.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { cp, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { dieWithFile, removeWithFile } from './reaper.js';
import { skipWithout } from './required-tool.js';
import { stablePorts } from './ports.js';

export interface EtcdServer {
  /** Discovery URL, `etcd://127.0.0.1:PORT`. */
  url: string;
  /** Client endpoint for a raw etcd3 client, `http://127.0.0.1:PORT`. */
  endpoint: string;
  /** The etcd process running now (undefined while stopped). */
  readonly pid: number | undefined;
  /** Its data directory: removed by stop(), else at this process's exit. */
  readonly dataDir: string;
  /** Kills etcd and removes its data directory. Safe to call twice. */
  stop(): Promise<void>;
  /** Graceful stop (SIGTERM) if running, then starts again on the same ports and data directory. */
  restart(): Promise<void>;
  /** SIGKILL, keeping the data directory: a crash. `restart()` brings it back. */
  kill(): Promise<void>;
  /** Graceful stop, a copy of the data directory (a backup, as of now), start again; returns the copy. */
  backup(): Promise<string>;
  /** SIGKILL, then starts on a copy of `backup`: etcd restored from a backup, everything since lost. */
  restore(backup: string): Promise<void>;
}

const READY_LINE = 'ready to serve client requests';
const READY_BOUND_MS = 20_000;
const EXIT_BOUND_MS = 10_000;
const MAX_OUTPUT = 64 * 1024;

let cachedBinary: string | null | undefined;

function executable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** `$ETCD_BIN`, then `etcd` on PATH, then the usual install locations. */
export function etcdBinary(): string | undefined {
  if (cachedBinary === undefined) {
    const candidates = [
      process.env.ETCD_BIN,
      ...(process.env.PATH ?? '').split(delimiter).filter(Boolean).map((dir) => join(dir, 'etcd')),
      '/usr/bin/etcd',
      '/usr/local/bin/etcd',
    ];
    cachedBinary = candidates.find((p): p is string => p !== undefined && p !== '' && executable(p)) ?? null;
  }
  return cachedBinary ?? undefined;
}

export function etcdAvailable(): boolean {
  return etcdBinary() !== undefined;
}


/**
 * For `describe('…', { skip: etcdSkipReason() }, …)`: undefined when etcd is installed. When it is
 * missing, prints a banner and returns the skip reason, except under CI (CI=true), where a silently
 * skipped suite would hide a broken environment, so it throws instead.
 */
export function etcdSkipReason(): string | undefined {
  return skipWithout(etcdAvailable(), 'etcd not installed: etcd tests SKIPPED; install etcd-server (or set ETCD_BIN)');
}


function waitExit(child: ChildProcess, boundMs: number): Promise<boolean> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      child.off('exit', onExit);
      resolve(false);
    }, boundMs);
    const onExit = () => {
      clearTimeout(timer);
      resolve(true);
    };
    child.once('exit', onExit);
  });
}

async function terminate(child: ChildProcess | undefined, signal: NodeJS.Signals): Promise<void> {
  if (!child) return;
  if (child.exitCode === null && child.signalCode === null) {
    child.kill(signal);
    if (!(await waitExit(child, EXIT_BOUND_MS))) {
      child.kill('SIGKILL');
      await waitExit(child, EXIT_BOUND_MS);
    }
  }
}

function launch(binary: string, args: string[]): Promise<ChildProcess> {
  const child = dieWithFile(spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'] }));
  let output = '';
  return new Promise((resolve, reject) => {
    let settled = false;
    const finish = (err?: Error) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      child.off('exit', onExit);
      if (err) {
        child.kill('SIGKILL');
        reject(err);
      } else {
        // Keep draining the pipes so a chatty etcd never blocks on a full pipe.
        resolve(child);
      }
    };
    const onData = (chunk: Buffer) => {
      output = (output + chunk.toString('utf8')).slice(-MAX_OUTPUT);
      if (output.includes(READY_LINE)) finish();
    };
    const onExit = (code: number | null, signal: NodeJS.Signals | null) =>
      finish(new Error(`etcd exited before it was ready (code ${code}, signal ${signal}):\n${output}`));
    const timer = setTimeout(
      () => finish(new Error(`etcd not ready after ${READY_BOUND_MS} ms:\n${output}`)),
      READY_BOUND_MS,
    );
    child.stdout?.on('data', onData);
    child.stderr?.on('data', onData);
    child.once('exit', onExit);
    child.once('error', (err) => finish(new Error(`cannot start ${binary}: ${err.message}`)));
  });
}

export async function startEtcd(): Promise<EtcdServer> {
  const binary = etcdBinary();
  if (!binary) throw new Error('etcd not installed: install etcd-server or set ETCD_BIN');
  const dataDir = removeWithFile(await mkdtemp(join(tmpdir(), 'ebb-etcd-')));

  let clientPort = 0;
  let child: ChildProcess | undefined;
  let argsFor: () => string[] = () => [];
  // The ports are free when probed but could be taken before etcd binds them: retry with new ones.
  for (let attempt = 1; ; attempt++) {
    const [client, peer] = await stablePorts(2);
    if (client === undefined || peer === undefined) throw new Error('could not allocate ports');
    const clientUrl = `http://127.0.0.1:${client}`;
    const peerUrl = `http://127.0.0.1:${peer}`;
    argsFor = () => [
      '--name', 'ebb-test',
      '--data-dir', dataDir,
      '--listen-client-urls', clientUrl,
      '--advertise-client-urls', clientUrl,
      '--listen-peer-urls', peerUrl,
      '--initial-advertise-peer-urls', peerUrl,
      '--initial-cluster', `ebb-test=${peerUrl}`,
    ];
    try {
      child = await launch(binary, argsFor());
      clientPort = client;
      break;
    } catch (err) {
      const inUse = err instanceof Error && err.message.includes('address already in use');
      if (!inUse || attempt >= 3) {
        await rm(dataDir, { recursive: true, force: true });
        throw err;
      }
      // etcd may have written a partial member dir for the wrong ports: start clean.
      await rm(join(dataDir, 'member'), { recursive: true, force: true });
    }
  }

  let stopped = false;
  const backups: string[] = [];
  const endpoint = `http://127.0.0.1:${clientPort}`;
  return {
    url: `etcd://127.0.0.1:${clientPort}`,
    endpoint,
    dataDir,
    get pid() {
      return child?.pid;
    },
    async stop() {
      if (stopped) return;
      stopped = true;
      await terminate(child, 'SIGKILL');
      child = undefined;
      await rm(dataDir, { recursive: true, force: true });
      await Promise.all(backups.map((b) => rm(b, { recursive: true, force: true })));
    },
    async restart() {
      if (stopped) throw new Error('etcd already stopped');
      await terminate(child, 'SIGTERM');
      child = undefined;
      child = await launch(binary, argsFor());
    },
    async kill() {
      await terminate(child, 'SIGKILL');
      child = undefined;
    },
    async backup() {
      if (stopped) throw new Error('etcd already stopped');
      await terminate(child, 'SIGTERM');
      child = undefined;
      const copy = removeWithFile(await mkdtemp(join(tmpdir(), 'ebb-etcd-backup-')));
      backups.push(copy);
      await cp(dataDir, copy, { recursive: true });
      child = await launch(binary, argsFor());
      return copy;
    },
    async restore(backup: string) {
      if (stopped) throw new Error('etcd already stopped');
      await terminate(child, 'SIGKILL');
      child = undefined;
      await rm(dataDir, { recursive: true, force: true });
      await cp(backup, dataDir, { recursive: true });
      child = await launch(binary, argsFor());
    },
  };
}
