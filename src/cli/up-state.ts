/**
 * Where each running `ebb up` says what it runs, so the operator commands without --frontend or
 * --discovery find its fleet: `ebb up` discovers in a temporary directory of its own, which no
 * default could name. One file per fleet (`up-<name>.json`, the name from `ebb up --name`, else its
 * pid), next to the default discovery directory; a file whose process is gone is removed when read
 * (an `ebb up` that was killed cannot remove it).
 */
import { readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { discoveryBaseDir, ensurePrivateDirSync } from '../discovery/private-dir.js';

export interface UpState {
  name: string;
  pid: number;
  discovery: string;
  frontend_url: string;
  admin_url?: string | undefined;
}

/** What a fleet name may hold: it becomes part of a file name. */
export const FLEET_NAME = /^[A-Za-z0-9._-]{1,64}$/;

const fileOf = (dir: string, name: string) => join(dir, `up-${name}.json`);
const NAME_OF_FILE = /^up-([A-Za-z0-9._-]{1,64})\.json$/;

export function upStateFile(name: string, env: NodeJS.ProcessEnv = process.env): string {
  return fileOf(discoveryBaseDir(env), name);
}

export function writeUpState(state: UpState): void {
  const file = fileOf(ensurePrivateDirSync(discoveryBaseDir()), state.name);
  writeFileSync(`${file}.${process.pid}.tmp`, JSON.stringify(state) + '\n', { mode: 0o600 });
  renameSync(`${file}.${process.pid}.tmp`, file);
}

/** Removes `name`'s file if it is still `pid`'s. */
export function removeUpState(name: string, pid: number): void {
  if (readState(upStateFile(name))?.pid === pid) rmSync(upStateFile(name), { force: true });
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false; // ESRCH: gone; EPERM: the pid is another user's process now
  }
}

function readState(file: string): UpState | undefined {
  try {
    const state = JSON.parse(readFileSync(file, 'utf8')) as Partial<UpState>;
    return typeof state.name === 'string' && typeof state.pid === 'number' && typeof state.discovery === 'string' && typeof state.frontend_url === 'string' ? (state as UpState) : undefined;
  } catch {
    return undefined;
  }
}

/** Every running `ebb up` of this user, by name; the files of those gone are removed. */
export function runningUps(env: NodeJS.ProcessEnv = process.env): UpState[] {
  const dir = discoveryBaseDir(env);
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return [];
  }
  const out: UpState[] = [];
  for (const entry of names) {
    const name = NAME_OF_FILE.exec(entry)?.[1];
    if (name === undefined) continue;
    const state = readState(join(dir, entry));
    if (state !== undefined && state.name === name && alive(state.pid)) out.push(state);
    else if (state !== undefined) rmSync(join(dir, entry), { force: true }); // a fleet that was killed
  }
  return out.sort((a, b) => a.name.localeCompare(b.name));
}
