import { Agent, request, errors as undiciErrors } from 'undici';
import type { Readable } from 'node:stream';
import { HttpError } from '../common/errors.js';
import type { WorkerMode } from '../discovery/discovery.js';
import type { GenerateBody, StreamLine } from '../worker/protocol.js';
import type { FrontendMetrics } from './metrics.js';
import type { PoolWorker, WorkerPool } from './worker-pool.js';

/** Refusals and pre-first-token failures are re-routed with their own budget. */
export const MAX_ATTEMPTS = 6;

/** One admitted request on one worker, with its first line already read (so nothing is sent before it). */
export interface UpstreamStream {
  worker: PoolWorker;
  first: StreamLine;
  rest: AsyncGenerator<StreamLine, void, void>;
  /** Ends the frontend's accounting of this worker's in-flight request; idempotent. */
  release(): void;
}

export class MidStreamFailure extends Error {
  constructor(readonly workerId: string, cause: unknown) {
    super(`worker ${workerId} failed mid-stream: ${(cause as Error)?.message ?? String(cause)}`);
  }
}

/** NDJSON lines of a worker's response body. */
async function* readLines(body: Readable): AsyncGenerator<StreamLine, void, void> {
  let buffer = '';
  body.setEncoding('utf8');
  for await (const chunk of body as AsyncIterable<string>) {
    buffer += chunk;
    let nl: number;
    while ((nl = buffer.indexOf('\n')) >= 0) {
      const line = buffer.slice(0, nl);
      buffer = buffer.slice(nl + 1);
      if (line.length > 0) yield JSON.parse(line) as StreamLine;
    }
  }
  if (buffer.trim().length > 0) yield JSON.parse(buffer) as StreamLine;
}

function isConnectFailure(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException).code;
  return (
    err instanceof undiciErrors.ConnectTimeoutError ||
    err instanceof undiciErrors.SocketError ||
    code === 'ECONNREFUSED' ||
    code === 'ECONNRESET' ||
    code === 'EPIPE' ||
    code === 'UND_ERR_SOCKET' ||
    code === 'UND_ERR_CLOSED'
  );
}

/**
 * Talks to workers over a keep-alive pool. `open` keeps trying workers until one sends a first
 * line: a refusal (503 worker_draining / worker_overloaded), a refused connection, or a worker that
 * dies before its first token all move the request to another worker without the client noticing.
 */
export class Upstream {
  readonly agent: Agent;

  constructor(
    private readonly pool: WorkerPool,
    private readonly metrics: FrontendMetrics,
    connections = 512,
  ) {
    this.agent = new Agent({ keepAliveTimeout: 30_000, keepAliveMaxTimeout: 60_000, connections, pipelining: 1, headersTimeout: 0, bodyTimeout: 0 });
  }

  async open(body: GenerateBody, mode: WorkerMode, signal: AbortSignal, tried: Set<string> = new Set()): Promise<UpstreamStream> {
    let lastRefusal: string | undefined;
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
      if (signal.aborted) throw signal.reason;
      const worker = this.pool.pick(body.model, mode, tried);
      if (!worker) break;
      const id = worker.record.worker_id;
      tried.add(id);
      worker.inflight++;
      let released = false;
      const release = () => {
        if (released) return;
        released = true;
        worker.inflight--;
      };
      try {
        const res = await request(`${worker.record.request_url}/generate`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify(body),
          dispatcher: this.agent,
          signal,
        });
        if (res.statusCode !== 200) {
          const payload = (await res.body.json().catch(() => ({}))) as { error?: { code?: string; message?: string } };
          const code = payload.error?.code ?? `http_${res.statusCode}`;
          release();
          if (code === 'worker_draining' || code === 'worker_overloaded') {
            this.pool.hold(id, code === 'worker_draining' ? 'draining' : 'overloaded');
            this.metrics.attempt(id, code);
            lastRefusal = code;
            continue;
          }
          if (res.statusCode >= 400 && res.statusCode < 500) {
            this.metrics.attempt(id, 'client_error');
            throw new HttpError(res.statusCode, code, payload.error?.message ?? 'worker rejected the request');
          }
          this.metrics.attempt(id, 'worker_error');
          continue;
        }
        const rest = readLines(res.body);
        const first = await rest.next();
        if (first.done || 'error' in first.value) {
          // Nothing has reached the client yet: another worker can still serve it whole.
          release();
          this.metrics.attempt(id, 'failed_before_first_token');
          continue;
        }
        this.metrics.attempt(id, 'routed');
        return { worker, first: first.value, rest, release };
      } catch (err) {
        release();
        if (err instanceof HttpError || signal.aborted) throw err;
        if (isConnectFailure(err)) this.pool.hold(id, 'unreachable');
        this.metrics.attempt(id, isConnectFailure(err) ? 'unreachable' : 'failed_before_first_token');
      }
    }
    if (!this.pool.hasModel(body.model)) throw new HttpError(404, 'model_not_found', `the model "${body.model}" does not exist or has no serving worker`);
    throw new HttpError(
      503,
      'no_serving_worker',
      lastRefusal ? `no worker could take the request (last refusal: ${lastRefusal}); retry shortly` : `no serving worker for "${body.model}" is reachable; retry shortly`,
    );
  }

  async close(): Promise<void> {
    await this.agent.close();
  }
}
