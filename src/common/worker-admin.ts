import { Agent, request } from 'undici';
import type { WorkerStatus } from '../protocol/admin.js';
import { codeOf } from '../protocol/errors.js';
import { bearerHeader } from './admin-auth.js';
import { AnswerTooLarge, readBounded } from './bounded-read.js';

/**
 * Plain HTTP calls to an admin API (a worker's system-status server or the frontend's admin
 * listener), shared by the frontend's fleet view and the operator CLI. Never throws for an HTTP
 * status: callers decide what a 4xx/5xx means. Throws Unreachable when no answer came.
 */

export type { WorkerStatus };

/** The live status of one worker as the fleet view reports it: never an exception. */
export type LiveStatus = { reachable: true; status: WorkerStatus } | { reachable: false; error: string };

export interface AdminResponse<T = unknown> {
  statusCode: number;
  headers: Record<string, string | string[] | undefined>;
  body: T;
}

export interface AdminCallOptions {
  method?: 'GET' | 'POST';
  headers?: Record<string, string>;
  /** JSON body; omitted means no body at all. */
  body?: unknown;
  timeoutMs: number;
  agent: Agent;
  /** Bound on the answer's body; a longer one fails the call (Unreachable) as soon as it is past. Default: none. */
  maxBytes?: number | undefined;
}

/**
 * Bound on what the frontend reads from a worker's admin API per answer (a status, a drain reply) and
 * per event of its status stream: a status is a few KiB. A record pointing at a server that answers
 * hundreds of MB per read must not take the frontend's memory with it.
 */
export const WORKER_ANSWER_LIMIT = 256 * 1024;

export class Unreachable extends Error {
  constructor(
    readonly url: string,
    readonly reason: string,
  ) {
    super(`cannot reach ${url}: ${reason}`);
  }
}

/** A dedicated pool for admin calls: never shares sockets (or queueing) with the request plane. */
export function createAdminAgent(connectTimeoutMs = 1000): Agent {
  return new Agent({ connect: { timeout: connectTimeoutMs }, keepAliveTimeout: 10_000, connections: 16 });
}

/** A short reason for a failed call: the errno-style code when there is one, else the message. */
export function failureReason(err: unknown, timeoutMs: number): string {
  const e = err as NodeJS.ErrnoException & { name?: string };
  if (err instanceof AnswerTooLarge) return err.message;
  if (e?.name === 'TimeoutError' || e?.name === 'AbortError' || e?.code === 'UND_ERR_CONNECT_TIMEOUT' || e?.code === 'UND_ERR_HEADERS_TIMEOUT')
    return `timed out after ${timeoutMs} ms`;
  if (typeof e?.code === 'string' && !e.code.startsWith('UND_ERR_')) return e.code;
  return e?.message ?? String(err);
}

export async function adminCall<T = unknown>(url: string, opts: AdminCallOptions): Promise<AdminResponse<T>> {
  const headers: Record<string, string> = { ...opts.headers };
  if (opts.body !== undefined) headers['content-type'] = 'application/json';
  try {
    const res = await request(url, {
      method: opts.method ?? 'GET',
      headers,
      body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
      dispatcher: opts.agent,
      signal: AbortSignal.timeout(opts.timeoutMs),
    });
    const text = await readBounded(res.body, opts.maxBytes ?? Infinity);
    let body: unknown = text;
    try {
      body = text === '' ? {} : JSON.parse(text);
    } catch {
      /* not JSON: keep the text for the error message */
    }
    return { statusCode: res.statusCode, headers: res.headers, body: body as T };
  } catch (err) {
    throw new Unreachable(url, failureReason(err, opts.timeoutMs));
  }
}

/** The `error.message` of an ebb error body, or a short rendering of whatever came back. */
export function errorMessageOf(body: unknown): string {
  const msg = (body as { error?: { message?: unknown } } | undefined)?.error?.message;
  if (typeof msg === 'string') return msg;
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  return text.length > 200 ? `${text.slice(0, 200)}...` : text;
}

function isWorkerStatus(v: unknown): v is WorkerStatus {
  const s = v as Partial<WorkerStatus> | undefined;
  return typeof s === 'object' && s !== null && typeof s.state === 'string' && typeof s.inflight_requests === 'number';
}

/**
 * Who answers at a system URL, from its open /live (no credential needed): the worker_id it says, or
 * undefined when it says none (a worker older than that, or no ebb worker at all: its status read
 * tells). Throws Unreachable when nothing answers.
 */
export async function identityAt(systemUrl: string, agent: Agent, timeoutMs: number): Promise<unknown> {
  const live = await adminCall<{ worker_id?: unknown } | string>(`${systemUrl}/live`, { agent, timeoutMs, maxBytes: WORKER_ANSWER_LIMIT });
  return typeof live.body === 'object' && live.body !== null ? live.body.worker_id : undefined;
}

export interface StatusReadOptions {
  /** Presented as a bearer token: a worker with an admin token answers its status to token holders only. */
  token?: string | undefined;
  /**
   * Ask the worker's open /live who it is before the token goes out (the operator's own token, to a
   * URL read from discovery): a port reused by another worker, or a stale record, never gets it.
   */
  proveFirst?: boolean | undefined;
}

/**
 * GET {systemUrl}/engine/status with a short timeout and a bounded read, folded into a LiveStatus.
 * The URL comes from a discovery record, so the answer is trusted only as far as it proves to be
 * worker `workerId`'s status: anything else is reported as unreachable without echoing it (the
 * record may point at any service; its answer must not come back through the fleet view). An ebb
 * error body (a loading worker's 503) keeps its catalogue code and message.
 */
export async function fetchLiveStatus(systemUrl: string, workerId: string, agent: Agent, timeoutMs: number, opts: StatusReadOptions = {}): Promise<LiveStatus> {
  try {
    let token = opts.token;
    if (token !== undefined && opts.proveFirst === true) {
      const said = await identityAt(systemUrl, agent, timeoutMs);
      if (said !== undefined && said !== workerId) return { reachable: false, error: identityMismatch(systemUrl, said, workerId) };
      // A worker older than worker_id on /live keeps its status open: read it without the token.
      if (said === undefined) token = undefined;
    }
    const res = await adminCall(`${systemUrl}/engine/status`, { agent, timeoutMs, maxBytes: WORKER_ANSWER_LIMIT, headers: bearerHeader(token) });
    if (res.statusCode !== 200) {
      const code = codeOf(res.body);
      return { reachable: false, error: `HTTP ${res.statusCode}${code === undefined ? '' : `: ${errorMessageOf(res.body)}`}` };
    }
    if (!isWorkerStatus(res.body)) return { reachable: false, error: 'HTTP 200 without a worker status: not an ebb worker' };
    const answered = res.body.worker_id;
    if (answered !== workerId) return { reachable: false, error: identityMismatch(systemUrl, answered, workerId) };
    return { reachable: true, status: res.body };
  } catch (err) {
    return { reachable: false, error: err instanceof Unreachable ? err.reason : (err as Error).message };
  }
}

/** "http://h:p is now worker \"w-2\", not w-1": the answered id only when it is a plausible one (short, printable). */
export function identityMismatch(systemUrl: string, answered: unknown, expected: string): string {
  const shown = typeof answered === 'string' && answered.length <= 256 && !/[\p{Cc}]/u.test(answered) ? JSON.stringify(answered) : 'something else';
  return `${systemUrl} answers as worker ${shown}, not ${expected} (worker_identity_mismatch)`;
}
