import { createHash, timingSafeEqual } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { isIP } from 'node:net';
import { EbbError } from '../protocol/errors.js';

/**
 * The auth boundary of every admin route (the worker's system-status server, the frontend's admin
 * listener). One rule set, used by both:
 *
 * - Admin listeners bind loopback by default. Binding anything else without an admin token is
 *   refused at start: an open drain button on the network is a denial-of-service switch.
 * - With a token, mutating routes need `Authorization: Bearer <token>`: 401 (with
 *   `WWW-Authenticate: Bearer`) when it is missing or not Bearer, 403 when it is wrong.
 *   Read-only status and the probes (/live, /health, /metrics) stay open.
 * - The token comes from `--admin-token-file PATH` (first line, trimmed) or env EBB_ADMIN_TOKEN;
 *   the file wins when both are set.
 */

export const ADMIN_TOKEN_ENV = 'EBB_ADMIN_TOKEN';

export type AdminGuard = (authorization: string | undefined) => void;

/** Reads the admin token: the file if given, else EBB_ADMIN_TOKEN; undefined when neither is set. */
export async function loadAdminToken(tokenFile: string | undefined, env: NodeJS.ProcessEnv = process.env): Promise<string | undefined> {
  if (tokenFile !== undefined) {
    let text: string;
    try {
      text = await readFile(tokenFile, 'utf8');
    } catch (err) {
      throw new Error(`cannot read admin token file ${tokenFile}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
    const token = (text.split(/\r?\n/, 1)[0] ?? '').trim();
    if (token === '') throw new Error(`admin token file ${tokenFile} is empty`);
    return token;
  }
  const fromEnv = env[ADMIN_TOKEN_ENV]?.trim();
  return fromEnv ? fromEnv : undefined;
}

/** 127.0.0.0/8, ::1 (and IPv4-mapped loopback), or the name localhost. Other names count as non-loopback. */
export function isLoopback(host: string): boolean {
  const h = host.trim().toLowerCase().replace(/^\[(.*)\]$/, '$1');
  if (h === 'localhost' || h.endsWith('.localhost')) return true;
  if (isIP(h) === 4) return h.startsWith('127.');
  if (isIP(h) === 6) {
    if (h === '::1' || /^0{0,4}(:0{0,4}){6}:0{0,3}1$/.test(h)) return true;
    const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(h);
    return mapped !== null && (mapped[1] as string).startsWith('127.');
  }
  return false;
}

/** Throws (one clear line) when an admin listener would bind a non-loopback address without a token. */
export function assertAdminBindAllowed(host: string, token: string | undefined, flag: string): void {
  if (token !== undefined || isLoopback(host)) return;
  throw new Error(
    `refusing to serve the admin API on non-loopback address ${host} (${flag}) without an admin token: ` +
      `set --admin-token-file PATH or ${ADMIN_TOKEN_ENV}, or bind 127.0.0.1`,
  );
}

const digest = (s: string): Buffer => createHash('sha256').update(s, 'utf8').digest();

/** The bearer token of an Authorization header, or undefined when absent or not Bearer. */
export function bearerToken(authorization: string | undefined): string | undefined {
  const m = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(authorization ?? '');
  return m ? m[1] : undefined;
}

/** A guard for mutating admin routes; undefined (no checks) when no token is configured. */
export function createAdminGuard(token: string | undefined): AdminGuard | undefined {
  if (token === undefined) return undefined;
  // Constant-time: both sides are SHA-256 digests, so timingSafeEqual compares equal lengths and
  // neither the token's length nor its prefix leaks through timing.
  const expected = digest(token);
  return (authorization) => {
    const presented = bearerToken(authorization);
    if (presented === undefined) {
      throw new EbbError('unauthorized', 'this admin route needs an Authorization: Bearer <admin token> header', {
        headers: { 'www-authenticate': 'Bearer realm="ebb-admin"' },
      });
    }
    if (!timingSafeEqual(digest(presented), expected)) throw new EbbError('forbidden', 'the admin token is not valid');
  };
}

/** `Authorization` header value for clients holding a token. */
export function bearerHeader(token: string | undefined): Record<string, string> {
  return token === undefined ? {} : { authorization: `Bearer ${token}` };
}
