import { errors as undiciErrors } from 'undici';
import { EbbError, isErrorCode, type ErrorCode } from '../../protocol/errors.js';
import { workerAnswer } from '../../protocol/worker-answers.js';
import type { Handoff, KvTransferRef } from '../../protocol/request-plane.js';
import type { Hold, WorkerPool } from '../routing/worker-pool.js';

/*
 * What a worker's answer means for the request: the failures the relay tells the client about
 * (mid-stream), the ones that move the request to another worker (TryElsewhere, with the worker
 * held out when the answer says so), and the client's own errors (EbbError), as WORKER_ANSWERS says.
 */

/** A terminal error line a worker sent inside a stream it had started. */
export class WorkerStreamError extends Error {
  constructor(readonly line: { code: ErrorCode; message: string }) {
    super(line.message);
  }
}

/**
 * A stream that broke after tokens reached the client: what the client is told. A worker that said
 * why (worker_shut_down at its shutdown deadline) is relayed as it said it; a connection that just
 * closed is named as such, not as the transport's "other side closed".
 */
export class MidStreamFailure extends Error {
  readonly code: ErrorCode;
  constructor(
    readonly workerId: string,
    cause: unknown,
    /** Why no other worker continued it, when that was tried. */
    notContinued?: string,
    /** The code it ends with, where the reason it was not continued has its own (request_broke_workers). */
    code?: ErrorCode,
  ) {
    const said = cause instanceof WorkerStreamError ? cause.line : undefined;
    const what =
      said?.code === 'worker_shut_down'
        ? said.message
        : said
          ? `worker ${workerId} failed mid-stream: ${said.message}`
          : cause instanceof WorkerUnresponsive || cause instanceof HandedOff
            ? cause.message
            : cause instanceof StreamCut || isTransportError(cause)
              ? `worker ${workerId} closed the stream before it finished`
              : `worker ${workerId} failed mid-stream: ${(cause as Error)?.message ?? String(cause)}`;
    super(notContinued === undefined ? what : `${what}; no other worker continued it: ${notContinued}`);
    this.code = code ?? (cause instanceof HandedOff ? 'migration_failed' : said?.code === 'worker_shut_down' ? 'worker_shut_down' : 'worker_failed_mid_stream');
  }
}

/**
 * How a stream's worker broke under it, when it did (a loss: worker-losses.ts); undefined for a
 * hand-off, the worker's own shutdown deadline, or an error line about something else.
 */
export function brokeMidStream(cause: unknown): string | undefined {
  if (cause instanceof HandedOff) return undefined;
  if (cause instanceof WorkerStreamError) return ENGINE_FAILURES.has(cause.line.code) ? `its engine failed mid-stream (${cause.line.message})` : undefined;
  if (cause instanceof WorkerUnresponsive) return 'it stopped answering mid-stream';
  return 'it closed the stream before it finished';
}

/**
 * How a worker that had taken a request (its answer's head sent, or the request sent and not
 * answered) broke under it before the first token: a connection that closed, a head that never
 * came. A connection never made (refused, unreachable) is not a loss: the worker never had it.
 */
export function brokeBeforeFirstToken(err: unknown): string | undefined {
  if (err instanceof undiciErrors.HeadersTimeoutError || err instanceof undiciErrors.BodyTimeoutError) return 'it took the request and never answered';
  if (err instanceof WorkerUnresponsive) return 'it stopped answering before its first token';
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  if (err instanceof undiciErrors.SocketError || code === 'UND_ERR_SOCKET' || code === 'ECONNRESET' || code === 'EPIPE') return 'it closed the connection with the request on it';
  return undefined;
}

/** The worker's body ended without a terminal line. */
export class StreamCut extends Error {
  constructor() {
    super('stream ended without a final line');
  }
}

/** No bytes for the idle timeout, and the worker's /live did not answer either: hung (stopped, wedged). */
export class WorkerUnresponsive extends Error {
  constructor(workerId: string, idleMs: number) {
    super(`worker ${workerId} stopped answering (no bytes for ${idleMs} ms and /live did not answer)`);
  }
}

/** The worker stopped at its drain deadline and said so: the request continues elsewhere. */
export class HandedOff extends Error {
  constructor(
    readonly workerId: string,
    /** Where the next worker may pull the sequence's KV state, when the worker exported it. */
    readonly kv?: KvTransferRef,
    /** Its drain deadline, or a priority request that took the stream's batch slot. */
    readonly reason: Handoff['reason'] = 'drain_deadline',
  ) {
    super(reason === 'preempted' ? `worker ${workerId} paused the stream for a priority request` : `worker ${workerId} handed the stream off at its drain deadline`);
  }
}

function isTransportError(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  return err instanceof undiciErrors.SocketError || code === 'UND_ERR_SOCKET' || code === 'ECONNRESET' || code === 'EPIPE' || code === 'ERR_STREAM_PREMATURE_CLOSE';
}

/** This attempt failed in a way another worker may not: try the next one. */
export class TryElsewhere extends Error {
  constructor(
    readonly outcome: string,
    readonly hold?: Hold,
    /** What the worker said, for the client's message when no worker takes the request. */
    readonly said?: string,
    /** Its Retry-After in seconds (a draining worker's ETA): how long it is held, and what the client is told. */
    readonly retryAfterS?: number,
    /** The worker had taken the request and then died, went silent or its engine failed on it: how (a loss, worker-losses.ts). */
    readonly broke?: string,
  ) {
    super(said ?? outcome);
  }
}

/** A worker's answer that says its engine failed on the request (not a refusal): a loss when it took the request. */
const ENGINE_FAILURES: ReadonlySet<string> = new Set(['engine_error', 'internal_error']);

export function modelNotFound(model: string): EbbError {
  return new EbbError('model_not_found', `the model "${model}" does not exist (no worker serves it)`);
}

/**
 * A known model that no worker can take right now (draining, drained, overloaded): SDKs retry a 503.
 * Retry-After only where the frontend knows when it tries again (see WorkerPool.retryAfterS).
 */
export function noServingWorker(message: string, retryAfterS?: number): EbbError {
  return new EbbError('no_serving_worker', message, retryAfterS === undefined ? {} : { headers: { 'retry-after': String(retryAfterS) } });
}

/** 404 for a model nobody serves; 503 for one whose workers are all out of rotation for now. */
export function unavailableModel(pool: WorkerPool, model: string): EbbError {
  return pool.knows(model) ? noServingWorker(`no worker of "${model}" is serving right now (draining, drained or restarting); retry shortly`) : modelNotFound(model);
}

/** A decode worker could not get the prompt's KV (another decode took it, or it expired): prefill again. */
export class KvTransferLost extends Error {}

export function isConnectFailure(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException).code;
  return (
    err instanceof undiciErrors.ConnectTimeoutError ||
    err instanceof undiciErrors.HeadersTimeoutError || // accepted the connection, then never answered: hung
    code === 'ECONNREFUSED' ||
    code === 'UND_ERR_SOCKET' ||
    code === 'ECONNRESET'
  );
}

/**
 * A worker's error answer, as a non-200 body or as the terminal line of a stream with no token
 * yet, acted on as WORKER_ANSWERS says: passed to the client, re-routed, or turned into a 502.
 */
export function actOn(workerId: string, status: number, said: { code?: unknown; message?: unknown; param?: unknown } | undefined, retryAfter?: unknown): never {
  const code = said?.code;
  const message = typeof said?.message === 'string' ? said.message : `worker ${workerId} answered HTTP ${status}`;
  const row = workerAnswer(code);
  if (row.action === 'pass_to_client') throw new EbbError(code as ErrorCode, message, typeof said?.param === 'string' ? { param: said.param } : {});
  if (row.action === 'bad_gateway') throw new EbbError('worker_protocol_error', `worker ${workerId} answered ${String(code)} (HTTP ${status}), which the request plane does not allow: ${message}`);
  if (row.keep) throw new KvTransferLost(message);
  const seconds = Number(retryAfter);
  const broke = typeof code === 'string' && ENGINE_FAILURES.has(code) ? `its engine failed on it (${message})` : undefined;
  throw new TryElsewhere(isErrorCode(code) ? code : 'worker_error', row.hold, `worker ${workerId}: ${message}`, retryAfter !== undefined && Number.isSafeInteger(seconds) && seconds > 0 ? seconds : undefined, broke);
}

export function rejectNon200(workerId: string, statusCode: number, body: unknown, retryAfter?: unknown): never {
  actOn(workerId, statusCode, (body as { error?: { code?: unknown; message?: unknown; param?: unknown } } | null)?.error, retryAfter);
}
