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
 *   `WWW-Authenticate: Bearer`) when it is missing or not Bearer, 403 when it is wrong (a client
 *   API key, 401 `invalid_api_key`, as OpenAI answers).
 *   Read-only status and the probes (/live, /health, /metrics) stay open; a worker's event streams
 *   (/kv/events, /engine/status/events) need the token, since each holds a connection for as long
 *   as it lasts (a frontend presents it: --worker-admin-token-file, default its own admin token).
 * - The token comes from `--admin-token-file PATH` (first line, trimmed) or env EBB_ADMIN_TOKEN;
 *   the file wins when both are set.
 * - Several operators (or tools) may each have a token of their own: a file whose every non-empty
 *   line is `name:token` holds named tokens, and the name of the one presented is the actor in the
 *   worker's audit trail. Any other file is one token, named "admin" (so is the env variable).
 */

export const ADMIN_TOKEN_ENV = 'EBB_ADMIN_TOKEN';

/** Checks a request; returns the name of the token presented (the audit trail's actor). */
export type AdminGuard = (authorization: string | undefined) => string;

export interface NamedToken {
  name: string;
  token: string;
}

/** The name of a token from a single-token file or EBB_ADMIN_TOKEN. */
export const DEFAULT_TOKEN_NAME = 'admin';

const NAMED_LINE = /^([A-Za-z0-9_.-]{1,64}):(\S+)$/;

/**
 * A token file's tokens: named when every non-empty line (# comments aside) is `name:token`,
 * else the first line as one token named "admin" (the single-token format, unchanged).
 */
export function parseTokenFile(text: string, path: string): NamedToken[] {
  const lines = text.split(/\r?\n/).map((l) => l.trim()).filter((l) => l !== '' && !l.startsWith('#'));
  if (lines.length > 0 && lines.every((l) => NAMED_LINE.test(l))) {
    const tokens = lines.map((l) => {
      const m = NAMED_LINE.exec(l) as RegExpExecArray;
      return { name: m[1] as string, token: m[2] as string };
    });
    const names = new Set<string>();
    for (const t of tokens) {
      if (names.has(t.name)) throw new Error(`admin token file ${path} names "${t.name}" twice`);
      names.add(t.name);
    }
    return tokens;
  }
  const token = (text.split(/\r?\n/, 1)[0] ?? '').trim();
  if (token === '') throw new Error(`admin token file ${path} is empty`);
  return [{ name: DEFAULT_TOKEN_NAME, token }];
}

/** The admin tokens a server accepts: the file's (see parseTokenFile), else EBB_ADMIN_TOKEN named "admin"; undefined when neither is set. */
export async function loadAdminTokens(tokenFile: string | undefined, env: NodeJS.ProcessEnv = process.env): Promise<NamedToken[] | undefined> {
  if (tokenFile === undefined) {
    const fromEnv = env[ADMIN_TOKEN_ENV]?.trim();
    return fromEnv ? [{ name: DEFAULT_TOKEN_NAME, token: fromEnv }] : undefined;
  }
  let text: string;
  try {
    text = await readFile(tokenFile, 'utf8');
  } catch (err) {
    throw new Error(`cannot read admin token file ${tokenFile}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  return parseTokenFile(text, tokenFile);
}

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

/**
 * The one admin token a client (the CLI) sends: the file if given, else EBB_ADMIN_TOKEN; undefined
 * when neither is set. A named file must hold exactly one token (`alice:secret`).
 */
export async function loadAdminToken(tokenFile: string | undefined, env: NodeJS.ProcessEnv = process.env): Promise<string | undefined> {
  const tokens = await loadAdminTokens(tokenFile, env);
  if (tokens === undefined) return undefined;
  if (tokens.length > 1) throw new Error(`admin token file ${tokenFile} holds ${tokens.length} named tokens; a client needs a file with one (name:token or just the token)`);
  return tokens[0]?.token;
}

/**
 * The request plane (worker /generate, /prefill, /kv) has a token of its own, shared by the
 * frontends and workers of one fleet: a worker reachable off loopback without one would serve (and,
 * for decode workers, pull KV for) anyone. From --request-token-file PATH or env EBB_REQUEST_TOKEN.
 */
export const REQUEST_TOKEN_ENV = 'EBB_REQUEST_TOKEN';
/** The admin token a frontend presents to workers' event streams (see --worker-admin-token-file). */
export const WORKER_ADMIN_TOKEN_ENV = 'EBB_WORKER_ADMIN_TOKEN';

export function loadRequestToken(tokenFile: string | undefined, env: NodeJS.ProcessEnv = process.env): Promise<string | undefined> {
  return loadToken(tokenFile, REQUEST_TOKEN_ENV, 'request-plane', env);
}

/** 127.0.0.0/8 or ::1 (and IPv4-mapped loopback), given lower-case and without brackets; names are not addresses. */
export function isLoopbackAddress(h: string): boolean {
  if (isIP(h) === 4) return h.startsWith('127.');
  if (isIP(h) === 6) {
    if (h === '::1' || /^0{0,4}(:0{0,4}){6}:0{0,3}1$/.test(h)) return true;
    const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(h);
    return mapped !== null && (mapped[1] as string).startsWith('127.');
  }
  return false;
}

/** A loopback address, or the name localhost (or a name under it). Other names count as non-loopback. */
export function isLoopback(host: string): boolean {
  const h = host.trim().toLowerCase().replace(/^\[(.*)\]$/, '$1');
  return h === 'localhost' || h.endsWith('.localhost') || isLoopbackAddress(h);
}

/** Throws (one clear line) when an admin listener would bind a non-loopback address without a token. */
export function assertAdminBindAllowed(host: string, token: string | readonly NamedToken[] | undefined, flag: string): void {
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

/**
 * A guard for mutating admin routes (or, with what = 'request-plane', every request-plane route);
 * undefined (no checks) when no token is configured. Returns the name of the token presented.
 */
export function createAdminGuard(tokens: string | readonly NamedToken[] | undefined, what = 'admin'): AdminGuard | undefined {
  if (tokens === undefined) return undefined;
  const named = typeof tokens === 'string' ? [{ name: DEFAULT_TOKEN_NAME, token: tokens }] : tokens;
  if (named.length === 0) return undefined;
  // Constant-time: both sides are SHA-256 digests, so timingSafeEqual compares equal lengths and
  // neither the token's length nor its prefix leaks through timing; every token is compared, so
  // which one matched does not leak either.
  const expected = named.map((t) => ({ name: t.name, digest: digest(t.token) }));
  return (authorization) => {
    const presented = bearerToken(authorization);
    if (presented === undefined) {
      throw new EbbError('unauthorized', `this ${what === 'admin' ? 'admin route' : what} needs an Authorization: Bearer <${what} token> header`, {
        headers: { 'www-authenticate': 'Bearer realm="ebb-admin"' },
      });
    }
    const got = digest(presented);
    let match: string | undefined;
    for (const e of expected) if (timingSafeEqual(got, e.digest) && match === undefined) match = e.name;
    // A client's API key is answered as OpenAI answers a wrong key (401 invalid_api_key: its SDKs raise AuthenticationError); an admin or request-plane token, 403.
    if (match === undefined) throw what === 'API' ? new EbbError('invalid_api_key', 'Incorrect API key provided: it is not one of this server\'s keys (--api-key-file)') : new EbbError('forbidden', `the ${what} token is not valid`);
    return match;
  };
}

/** `Authorization` header value for clients holding a token. */
export function bearerHeader(token: string | undefined): Record<string, string> {
  return token === undefined ? {} : { authorization: `Bearer ${token}` };
}
