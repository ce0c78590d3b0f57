/**
 * Where a running `ebb up` says what it runs, so the operator commands without --frontend or
 * --discovery find its fleet: `ebb up` discovers in a temporary directory of its own, which no
 * default could name. One file per user, next to the default discovery directory; a file whose
 * process is gone is ignored (an `ebb up` that was killed cannot remove it).
 */
import { readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { discoveryBaseDir, ensurePrivateDirSync } from '../discovery/private-dir.js';

export interface UpState {
  pid: number;
  discovery: string;
  frontend_url: string;
  admin_url?: string | undefined;
}

export function upStateFile(env: NodeJS.ProcessEnv = process.env): string {
  return join(discoveryBaseDir(env), 'up.json');
}

export function writeUpState(state: UpState): void {
  const file = join(ensurePrivateDirSync(discoveryBaseDir()), 'up.json');
  writeFileSync(`${file}.${process.pid}.tmp`, JSON.stringify(state) + '\n', { mode: 0o600 });
  renameSync(`${file}.${process.pid}.tmp`, file);
}

/** Removes the file if it is still `pid`'s (a later `ebb up` may have written its own since). */
export function removeUpState(pid: number): void {
  if (readState()?.pid === pid) rmSync(upStateFile(), { force: true });
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false; // ESRCH: gone; EPERM: the pid is another user's process now
  }
}

function readState(): UpState | undefined {
  try {
    const state = JSON.parse(readFileSync(upStateFile(), 'utf8')) as Partial<UpState>;
    return typeof state.pid === 'number' && typeof state.discovery === 'string' && typeof state.frontend_url === 'string' ? (state as UpState) : undefined;
  } catch {
    return undefined;
  }
}

/** The running `ebb up` of this user, if any. */
export function runningUp(): UpState | undefined {
  const state = readState();
  return state !== undefined && alive(state.pid) ? state : undefined;
}
