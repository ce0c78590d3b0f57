import type { FastifyReply } from 'fastify';
import type { Logger } from 'pino';
import { EbbError, errorBody } from '../protocol/errors.js';
import type { GenerateBody, StreamLine, Usage } from '../protocol/request-plane.js';
import { ClientStream } from './client-stream.js';
import { LaneWriter } from './lane-writer.js';
import type { FrontendMetrics } from './metrics.js';
import { Delivered, type MigrationReason } from './migration.js';
import { sumUsage, type CollectedChoice, type StreamFormat } from './openai-format.js';
import { HandedOff, MidStreamFailure, StreamCut, WorkerStreamError, WorkerUnresponsive, type Upstream, type UpstreamStream } from './upstream.js';
import { feedLines, type TokenSink } from './worker-call.js';
import type { WorkerPool } from './worker-pool.js';

export interface RelayDeps {
  pool: WorkerPool;
  upstream: Upstream;
  metrics: FrontendMetrics;
  log: Logger;
  /** How many times one sequence may move to another worker mid-stream; 0 disables. */
  migrationLimit: number;
}

/** One sequence of a response (a choice), from its first worker to whichever finishes it. */
interface Lane {
  index: number;
  gen: GenerateBody;
  up: UpstreamStream;
  tried: Set<string>;
  delivered: Delivered;
}

/** A lane that could not be finished: the failure the whole response ends with. */
class LaneFailed extends Error {
  constructor(readonly failure: MidStreamFailure) {
    super(failure.message);
  }
}

/** What a streamed lane leaves unwritten when it ends, and its usage. */
interface LaneEnd {
  tail: string;
  usage: Usage;
}

/**
 * Moving tokens from workers to clients: opening the sequences of a response on workers, relaying
 * them into one client stream (or collecting them), and continuing any sequence whose worker fails
 * or hands it off on another worker, from what was delivered, so the client sees one answer.
 */
export function createRelay({ pool, upstream, metrics, log, migrationLimit }: RelayDeps) {
  function open(gen: GenerateBody, signal: AbortSignal, tried?: Set<string>): Promise<UpstreamStream> {
    return pool.servingPath(gen.model) === 'disaggregated' ? upstream.openDisaggregated(gen, signal, tried) : upstream.open(gen, 'aggregated', signal, tried);
  }

  /** Opens every sequence before anything is committed to the client: a refusal is still a JSON error. */
  async function openLanes(gens: GenerateBody[], signal: AbortSignal): Promise<Lane[]> {
    if (gens.length === 1) {
      const tried = new Set<string>();
      const gen = gens[0]!;
      return [{ index: 0, gen, up: await open(gen, signal, tried), tried, delivered: new Delivered() }];
    }
    const opened = await Promise.allSettled(
      gens.map(async (gen, index): Promise<Lane> => {
        const tried = new Set<string>();
        return { index, gen, up: await open(gen, signal, tried), tried, delivered: new Delivered() };
      }),
    );
    const failed = opened.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) {
      for (const r of opened) if (r.status === 'fulfilled') r.value.up.release();
      throw failed.reason;
    }
    return opened.map((r) => (r as PromiseFulfilledResult<Lane>).value);
  }

  /** A terminal line other than done: the error the lane's loop ends with. */
  function endOf(up: UpstreamStream, line: StreamLine): Error {
    return 'handoff' in line ? new HandedOff(up.worker.record.worker_id) : new WorkerStreamError((line as { error: { code: never; message: string } }).error);
  }

  /**
   * Moves a broken (or handed-off) sequence to another serving worker, which continues from what
   * was delivered; throws LaneFailed with why when none can.
   */
  async function continueElsewhere(lane: Lane, err: unknown, signal: AbortSignal): Promise<void> {
    const from = lane.up;
    from.release();
    const fromId = from.worker.record.worker_id;
    const reason: MigrationReason = err instanceof HandedOff ? 'handoff' : err instanceof WorkerUnresponsive ? 'worker_unresponsive' : 'worker_failed';
    if (lane.delivered.migrations >= migrationLimit) {
      metrics.migrationFailed('limit');
      const why = migrationLimit === 0 ? 'migration is disabled (--migration-limit 0)' : `the request already moved ${migrationLimit} times (--migration-limit)`;
      throw new LaneFailed(new MidStreamFailure(fromId, err, why));
    }
    try {
      lane.up = await open(lane.delivered.continuation(lane.gen), signal, lane.tried);
    } catch (e) {
      if (signal.aborted) throw e;
      metrics.migrationFailed(e instanceof EbbError && (e.code === 'no_serving_worker' || e.code === 'model_not_found') ? 'no_worker' : 'error');
      throw new LaneFailed(new MidStreamFailure(fromId, err, (e as Error).message));
    }
    const toId = lane.up.worker.record.worker_id;
    metrics.migrated(reason);
    log.info(
      { event: 'stream_migrated', request_id: lane.gen.request_id, from_worker: fromId, to_worker: toId, tokens_delivered: lane.delivered.tokens, reason },
      `request ${lane.gen.request_id} moved from ${fromId} to ${toId} after ${lane.delivered.tokens} tokens (${reason})`,
    );
  }

  /**
   * Relays one lane into the client stream across workers: its tokens are piped from the worker's
   * body into the lane's writer (one write per network read). Resolves with what it left unwritten
   * (its finish event, and with `linger` its last tokens, for the final write) and the usage of the
   * whole sequence.
   */
  async function relayLane(lane: Lane, writer: LaneWriter, fmt: StreamFormat, signal: AbortSignal, linger: boolean): Promise<LaneEnd> {
    for (;;) {
      try {
        writer.body = lane.up.body;
        const end = feed(lane.up, writer) ?? (await lane.up.body.pipe(writer));
        if (end !== undefined && 'done' in end) {
          if (!linger) writer.flush();
          return { tail: fmt.finished(lane.index, end.finish_reason), usage: lane.delivered.usage(end.usage) };
        }
        writer.flush();
        throw end === undefined ? new StreamCut() : endOf(lane.up, end);
      } catch (err) {
        if (signal.aborted || err instanceof LaneFailed) throw err;
        // Tokens read before the break were delivered: the client gets them before the continuation.
        writer.flush();
        await continueElsewhere(lane, err, signal);
      }
    }
  }

  /**
   * Streams a response: every lane has a worker before the headers go out; from then on the relay
   * owns the lanes' upstream streams, and the one finally releases whichever is current, however
   * this ends. A sequence that breaks and that no worker can continue ends the response with an
   * error event saying why; nothing is ever cut without one. The headers leave with the first
   * tokens, and a single lane's last tokens with the end: one system call each.
   */
  async function stream(reply: FastifyReply, fmt: StreamFormat, gens: GenerateBody[], n: number, signal: AbortSignal, started: number): Promise<void> {
    const lanes = await openLanes(gens, signal);
    const res = reply.raw;
    const out = new ClientStream(res);
    const writers = lanes.map((lane) => new LaneWriter(out, lane.index, fmt, lane.delivered));
    // One lane failing stops the others: the response ends once, with the error.
    const stop = new AbortController();
    const laneSignal = lanes.length === 1 ? signal : AbortSignal.any([signal, stop.signal]);
    try {
      metrics.firstToken((performance.now() - started) / 1000);
      reply.hijack();
      out.cork();
      out.begin(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'x-ebb-worker-id': headerValue(lanes[0]!.up.worker.record.worker_id) });
      out.write(fmt.opening());
      lanes.forEach((lane, i) => {
        const end = feed(lane.up, writers[i]!);
        writers[i]!.flush();
        if (end !== undefined) lane.up.first = [end];
      });
      out.uncork();
      const linger = lanes.length === 1;
      const ends = await Promise.all(
        lanes.map((lane, i) =>
          relayLane(lane, writers[i]!, fmt, laneSignal, linger).catch((err: unknown) => {
            stop.abort(err);
            throw err;
          }),
        ),
      );
      const usages = ends.map((e) => e.usage);
      out.cork();
      for (const w of writers) w.flush();
      out.end(ends.map((e) => e.tail).join('') + fmt.end(sumLanes(usages, n)));
    } catch (err) {
      if (!signal.aborted) fail(res, lanes, err, fmt);
    } finally {
      for (const lane of lanes) lane.up.release();
      // The client left; releasing the upstream requests freed the workers' slots.
      if (signal.aborted) log.info({ event: 'client_gone', worker_id: lanes[0]!.up.worker.record.worker_id }, `client left a stream on ${lanes[0]!.up.worker.record.worker_id}`);
    }
  }

  /** Ends a stream that broke: an SSE error event when it had started, a JSON 500 when it never could. */
  function fail(res: FastifyReply['raw'], lanes: Lane[], err: unknown, fmt: StreamFormat): void {
    const workerId = lanes[0]!.up.worker.record.worker_id;
    try {
      if (!res.headersSent) {
        log.error({ event: 'response_failed', worker_id: workerId, err: (err as Error).message }, `could not start the response: ${(err as Error).message}`);
        res.writeHead(500, { 'content-type': 'application/json; charset=utf-8' });
        res.end(JSON.stringify(errorBody('internal_error', `could not start the response: ${(err as Error).message}`)));
        return;
      }
      const failure = err instanceof LaneFailed ? err.failure : new MidStreamFailure(workerId, err);
      metrics.midStreamFailure();
      log.warn({ event: 'midstream_failure', worker_id: failure.workerId, code: failure.code, err: failure.message }, failure.message);
      res.end(fmt.error(failure.code, failure.message));
    } catch {
      res.destroy();
    }
  }

  /** Collects one lane for a non-streaming response; a worker that fails half way is replaced the same way as in a stream. */
  async function collectLane(lane: Lane, signal: AbortSignal): Promise<CollectedChoice & { usage: Usage }> {
    const delivered = lane.delivered;
    const sink: TokenSink = { plain: (buf, start, end) => delivered.addBytes(buf, start, end), piece: (text, ids) => delivered.add(text, ids) };
    for (;;) {
      try {
        const end = feed(lane.up, sink) ?? (await lane.up.body.pipe(sink));
        if (end === undefined) throw new StreamCut();
        if ('done' in end) return { text: delivered.text, finishReason: end.finish_reason, usage: delivered.usage(end.usage) };
        throw endOf(lane.up, end);
      } catch (err) {
        if (signal.aborted || err instanceof LaneFailed) throw err;
        await continueElsewhere(lane, err, signal);
      }
    }
  }

  /** Non-streaming: nothing reaches the client until every choice is complete. */
  async function collect(gens: GenerateBody[], n: number, signal: AbortSignal): Promise<{ choices: CollectedChoice[]; usage: Usage }> {
    const lanes = await openLanes(gens, signal);
    try {
      const results = await Promise.all(lanes.map((lane) => collectLane(lane, signal)));
      return { choices: results, usage: sumLanes(results.map((r) => r.usage), n) };
    } catch (err) {
      if (err instanceof LaneFailed) throw new EbbError(err.failure.code, err.failure.message);
      throw err;
    } finally {
      for (const lane of lanes) lane.up.release();
    }
  }

  return { stream, collect };
}

export type Relay = ReturnType<typeof createRelay>;

/** An upstream's first batch (the lines read before the relay took it) into `sink`, once; the terminal line when it is among them. */
function feed(up: UpstreamStream, sink: TokenSink): StreamLine | undefined {
  const lines = up.first;
  up.first = [];
  return feedLines(lines, sink);
}

/** Usage of a response: the `n` choices of one prompt share its prompt tokens (see toGenerateBodies' order). */
function sumLanes(usages: Usage[], n: number): Usage {
  return usages.length === 1 ? usages[0]! : sumUsage(usages, n);
}

/**
 * A header value for a worker id: ids are operator-chosen and not checked against RFC 9110, so one
 * with characters a header cannot carry is sent percent-encoded rather than break the response.
 */
export function headerValue(value: string): string {
  return /^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$/.test(value) ? value : encodeURIComponent(value);
}

