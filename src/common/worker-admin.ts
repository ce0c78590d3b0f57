import { Agent, request } from 'undici';
import type { WorkerStatus } from '../protocol/admin.js';

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
}

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
    const text = await res.body.text();
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

/** GET {systemUrl}/engine/status with a short timeout, folded into a LiveStatus. */
export async function fetchLiveStatus(systemUrl: string, agent: Agent, timeoutMs: number): Promise<LiveStatus> {
  try {
    const res = await adminCall(`${systemUrl}/engine/status`, { agent, timeoutMs });
    if (res.statusCode !== 200 || !isWorkerStatus(res.body)) return { reachable: false, error: `HTTP ${res.statusCode}: ${errorMessageOf(res.body)}` };
    return { reachable: true, status: res.body };
  } catch (err) {
    return { reachable: false, error: err instanceof Unreachable ? err.reason : (err as Error).message };
  }
}
