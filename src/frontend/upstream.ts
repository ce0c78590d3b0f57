import { Agent, request, errors as undiciErrors, type Dispatcher } from 'undici';
import type { Readable } from 'node:stream';
import { codeOf, EbbError } from '../protocol/errors.js';
import type { WorkerMode } from '../discovery/discovery.js';
import type { GenerateBody, PrefillResponse, StreamLine } from '../protocol/request-plane.js';
import type { FrontendMetrics } from './metrics.js';
import type { Hold, PoolWorker, WorkerPool } from './worker-pool.js';

/** Refusals and pre-first-token failures are re-routed with their own budget, per serving stage. */
export const MAX_ATTEMPTS = 6;

/**
 * One admitted request on one worker, with its first batch already read (so nothing is sent to the
 * client before a worker has produced a token). Lines come in batches, one per network read: the
 * relay turns a batch into one write, which is what keeps the per-token cost low.
 */
export interface UpstreamStream {
  worker: PoolWorker;
  first: StreamLine[];
  rest: AsyncGenerator<StreamLine[], void, void>;
  /** Ends the frontend's accounting of this worker's in-flight request; idempotent. */
  release(): void;
}

export class MidStreamFailure extends Error {
  constructor(
    readonly workerId: string,
    cause: unknown,
  ) {
    super(`worker ${workerId} failed mid-stream: ${(cause as Error)?.message ?? String(cause)}`);
  }
}

/** This attempt failed in a way another worker may not: try the next one. */
class TryElsewhere extends Error {
  constructor(
    readonly outcome: string,
    readonly hold?: Hold,
  ) {
    super(outcome);
  }
}

export function modelNotFound(model: string): EbbError {
  return new EbbError('model_not_found', `the model "${model}" does not exist or has no serving worker`);
}

/** A decode worker could not get the prompt's KV (another decode took it, or it expired): prefill again. */
class KvTransferLost extends Error {}

/** NDJSON lines of a worker's response body, a batch per chunk received. */
async function* readLineBatches(body: Readable): AsyncGenerator<StreamLine[], void, void> {
  let buffer = '';
  body.setEncoding('utf8');
  for await (const chunk of body as AsyncIterable<string>) {
    buffer += chunk;
    const last = buffer.lastIndexOf('\n');
    if (last < 0) continue;
    const complete = buffer.slice(0, last);
    buffer = buffer.slice(last + 1);
    const batch: StreamLine[] = [];
    for (const line of complete.split('\n')) if (line.length > 0) batch.push(JSON.parse(line) as StreamLine);
    if (batch.length > 0) yield batch;
  }
  if (buffer.trim().length > 0) yield [JSON.parse(buffer) as StreamLine];
}

function isConnectFailure(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException).code;
  return (
    err instanceof undiciErrors.ConnectTimeoutError ||
    err instanceof undiciErrors.HeadersTimeoutError || // accepted the connection, then never answered: hung
    code === 'ECONNREFUSED' ||
    code === 'UND_ERR_SOCKET' ||
    code === 'ECONNRESET'
  );
}

/** A non-200 answer: a refusal or server error moves on; a client error is the client's answer. */
async function rejectNon200(res: Dispatcher.ResponseData): Promise<never> {
  const payload = (await res.body.json().catch(() => ({}))) as { error?: { code?: string; message?: string } };
  const code = codeOf(payload);
  if (code === 'worker_draining') throw new TryElsewhere(code, 'draining');
  if (code === 'worker_overloaded') throw new TryElsewhere(code, 'overloaded');
  if (code === 'kv_transfer_failed') throw new KvTransferLost(payload.error?.message ?? code);
  if (res.statusCode >= 400 && res.statusCode < 500) throw new EbbError(code ?? 'invalid_request', payload.error?.message ?? `worker rejected the request (HTTP ${res.statusCode})`);
  throw new TryElsewhere('worker_error');
}

/**
 * Talks to workers over a keep-alive pool. Every call goes through `route`, which keeps trying
 * workers of the right mode until one accepts: a refusal (worker_draining / worker_overloaded), a
 * refused connection, or a worker that dies before its first token all move the request to another
 * worker without the client noticing.
 */
export class Upstream {
  readonly agent: Agent;

  /**
   * `headersTimeoutMs` bounds how long a worker may take to answer /generate's headers, which it
   * sends right after admission, before any token: a worker silent past it is hung (stopped, stuck)
   * and the request moves on. Tokens themselves have no deadline: a long stream is not a hang.
   */
  constructor(
    private readonly pool: WorkerPool,
    private readonly metrics: FrontendMetrics,
    private readonly headersTimeoutMs = 10_000,
    connections = 512,
  ) {
    this.agent = new Agent({ keepAliveTimeout: 30_000, keepAliveMaxTimeout: 60_000, connections, pipelining: 1, headersTimeout: 0, bodyTimeout: 0 });
  }

  private async route<T>(
    model: string,
    mode: WorkerMode,
    signal: AbortSignal,
    tried: Set<string>,
    send: (worker: PoolWorker) => Promise<T>,
  ): Promise<{ worker: PoolWorker; value: T; release: () => void }> {
    let lastRefusal: string | undefined;
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
      if (signal.aborted) throw signal.reason;
      const worker = this.pool.pick(model, mode, tried);
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
        const value = await send(worker);
        this.metrics.attempt(id, 'routed');
        return { worker, value, release };
      } catch (err) {
        release();
        if (signal.aborted) throw err;
        if (err instanceof KvTransferLost) tried.delete(id); // the worker is fine; the KV is what is gone
        if (err instanceof EbbError || err instanceof KvTransferLost) {
          this.metrics.attempt(id, err instanceof KvTransferLost ? 'kv_transfer_lost' : 'client_error');
          throw err;
        }
        const failure = err instanceof TryElsewhere ? err : new TryElsewhere(isConnectFailure(err) ? 'unreachable' : 'failed_before_first_token', isConnectFailure(err) ? 'unreachable' : undefined);
        if (failure.hold) this.pool.hold(id, failure.hold);
        if (failure.hold === 'draining' || failure.hold === 'overloaded') lastRefusal = failure.outcome;
        this.metrics.attempt(id, failure.outcome);
      }
    }
    if (!this.pool.hasModel(model)) throw modelNotFound(model);
    throw new EbbError(
      'no_serving_worker',
      lastRefusal ? `no ${mode} worker could take the request (last refusal: ${lastRefusal}); retry shortly` : `no serving ${mode} worker for "${model}" is reachable; retry shortly`,
    );
  }

  private post(url: string, body: unknown, signal: AbortSignal, headersTimeout: number): Promise<Dispatcher.ResponseData> {
    return request(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), dispatcher: this.agent, signal, headersTimeout });
  }

  /** Opens a token stream on a worker of `mode` (aggregated, or decode with a KV transfer). */
  async open(body: GenerateBody, mode: WorkerMode, signal: AbortSignal, tried: Set<string> = new Set()): Promise<UpstreamStream> {
    const { worker, value, release } = await this.route(body.model, mode, signal, tried, async (w) => {
      const res = await this.post(`${w.record.request_url}/generate`, body, signal, this.headersTimeoutMs);
      if (res.statusCode !== 200) await rejectNon200(res);
      const rest = readLineBatches(res.body);
      const first = await rest.next();
      // Nothing has reached the client yet: another worker can still serve it whole.
      if (first.done || first.value.some((line) => 'error' in line)) {
        res.body.destroy();
        throw new TryElsewhere('failed_before_first_token');
      }
      return { first: first.value, rest, body: res.body };
    });
    // Releasing also closes the body: an abandoned stream would otherwise hold the worker's slot.
    const end = () => {
      value.body.destroy();
      release();
    };
    return { worker, first: value.first, rest: value.rest, release: end };
  }

  /**
   * Disaggregated serving: a prefill worker computes the prompt's KV, then a decode worker pulls it
   * and streams. A decode worker that dies after pulling the KV leaves nothing for the next one, so
   * the pair is redone (a fresh prefill) rather than the decode alone. An unclaimed transfer expires
   * on the prefill side (counted).
   */
  async openDisaggregated(body: GenerateBody, signal: AbortSignal, tried: Set<string> = new Set()): Promise<UpstreamStream> {
    for (let pair = 1; ; pair++) {
      const prefill = await this.route(body.model, 'prefill', signal, new Set(), async (w) => {
        const res = await this.post(`${w.record.request_url}/prefill`, body, signal, 0); // answers after the KV is computed
        if (res.statusCode !== 200) await rejectNon200(res);
        return (await res.body.json()) as PrefillResponse;
      });
      prefill.release();
      const kv = { transfer_id: prefill.value.transfer_id, source_url: prefill.value.source_url, worker_id: prefill.value.worker_id };
      try {
        return await this.open({ ...body, kv_transfer: kv }, 'decode', signal, tried);
      } catch (err) {
        if (!(err instanceof KvTransferLost)) throw err;
        if (pair >= MAX_ATTEMPTS) throw new EbbError('no_serving_worker', `decode workers could not take the KV of "${body.model}" requests; retry shortly`);
      }
    }
  }

  async close(): Promise<void> {
    await this.agent.close();
  }
}
