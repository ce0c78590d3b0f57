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

/** Reads a token: the file if given (first line, trimmed), else env `envName`; undefined when neither is set. */
export async function loadToken(tokenFile: string | undefined, envName: string, what: string, env: NodeJS.ProcessEnv = process.env): Promise<string | undefined> {
  if (tokenFile !== undefined) {
    let text: string;
    try {
      text = await readFile(tokenFile, 'utf8');
    } catch (err) {
      throw new Error(`cannot read ${what} token file ${tokenFile}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
    const token = (text.split(/\r?\n/, 1)[0] ?? '').trim();
    if (token === '') throw new Error(`${what} token file ${tokenFile} is empty`);
    return token;
  }
  const fromEnv = env[envName]?.trim();
  return fromEnv ? fromEnv : undefined;
}

/** Reads the admin token: the file if given, else EBB_ADMIN_TOKEN; undefined when neither is set. */
export function loadAdminToken(tokenFile: string | undefined, env: NodeJS.ProcessEnv = process.env): Promise<string | undefined> {
  return loadToken(tokenFile, ADMIN_TOKEN_ENV, 'admin', env);
}

/**
 * The request plane (worker /generate, /prefill, /kv) has a token of its own, shared by the
 * frontends and workers of one fleet: a worker reachable off loopback without one would serve (and,
 * for decode workers, pull KV for) anyone. From --request-token-file PATH or env EBB_REQUEST_TOKEN.
 */
export const REQUEST_TOKEN_ENV = 'EBB_REQUEST_TOKEN';

export function loadRequestToken(tokenFile: string | undefined, env: NodeJS.ProcessEnv = process.env): Promise<string | undefined> {
  return loadToken(tokenFile, REQUEST_TOKEN_ENV, 'request-plane', env);
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

/** Same rule for the request plane: off loopback only with a request-plane token. */
export function assertRequestBindAllowed(host: string, token: string | undefined, flag: string): void {
  if (token !== undefined || isLoopback(host)) return;
  throw new Error(
    `refusing to serve the request plane on non-loopback address ${host} (${flag}) without a request-plane token: ` +
      `set --request-token-file PATH or ${REQUEST_TOKEN_ENV}, or bind 127.0.0.1`,
  );
}

const digest = (s: string): Buffer => createHash('sha256').update(s, 'utf8').digest();

/** The bearer token of an Authorization header, or undefined when absent or not Bearer. */
export function bearerToken(authorization: string | undefined): string | undefined {
  const m = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(authorization ?? '');
  return m ? m[1] : undefined;
}

/** A guard for mutating admin routes (or, with what = 'request-plane', every request-plane route); undefined (no checks) when no token is configured. */
export function createAdminGuard(token: string | undefined, what = 'admin'): AdminGuard | undefined {
  if (token === undefined) return undefined;
  // Constant-time: both sides are SHA-256 digests, so timingSafeEqual compares equal lengths and
  // neither the token's length nor its prefix leaks through timing.
  const expected = digest(token);
  return (authorization) => {
    const presented = bearerToken(authorization);
    if (presented === undefined) {
      throw new EbbError('unauthorized', `this ${what === 'admin' ? 'admin route' : what} needs an Authorization: Bearer <${what} token> header`, {
        headers: { 'www-authenticate': 'Bearer realm="ebb-admin"' },
      });
    }
    if (!timingSafeEqual(digest(presented), expected)) throw new EbbError('forbidden', `the ${what} token is not valid`);
  };
}

/** `Authorization` header value for clients holding a token. */
export function bearerHeader(token: string | undefined): Record<string, string> {
  return token === undefined ? {} : { authorization: `Bearer ${token}` };
}
