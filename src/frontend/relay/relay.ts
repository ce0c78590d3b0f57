import type { FastifyReply } from 'fastify';
import type { Logger } from 'pino';
import { EbbError, errorBody } from '../../protocol/errors.js';
import type { GenerateBody, TokenLogprob, Usage } from '../../protocol/request-plane.js';
import { ClientStream, type StreamTap } from './client-stream.js';
import { LaneWriter } from './lane-writer.js';
import type { FrontendMetrics } from '../metrics.js';
import { sumUsage, type CollectedChoice, type StreamFormat } from '../wire/stream-format.js';
import { Lane, LaneFailed, openLanes, type LaneContext, type Resumed } from './lane.js';
import { MidStreamFailure } from './worker-answer.js';
import type { Upstream } from './upstream.js';
import { bodyLogIds } from '../../tracing/request-trace.js';
import { streamFailed } from '../request-outcome.js';

export interface RelayDeps {
  upstream: Upstream;
  metrics: FrontendMetrics;
  log: Logger;
  /** How many times one sequence may move to another worker mid-stream; 0 disables. */
  migrationLimit: number;
  /** How many times a flex sequence may be paused for a priority request; 0: never (default DEFAULT_PREEMPTION_LIMIT). */
  preemptionLimit?: number | undefined;
  /** A streaming client that reads nothing this long is disconnected (see ClientStream). */
  clientWriteTimeoutMs?: number | undefined;
}

/**
 * Moving tokens from workers to clients: each sequence of a response is a Lane (lane.ts), which
 * owns its worker, what it delivered and its moves to other workers; the relay opens the lanes,
 * gives them one client stream (or collects them), and ends the response once.
 */
/** --preemption-limit's default: a flex stream is paused for priority requests at most twice. */
export const DEFAULT_PREEMPTION_LIMIT = 2;

export function createRelay({ upstream, metrics, log, migrationLimit, preemptionLimit = DEFAULT_PREEMPTION_LIMIT, clientWriteTimeoutMs }: RelayDeps) {
  const ctx: LaneContext = {
    open: (gen, signal, tried, losses) => upstream.openServing(gen, signal, tried, losses),
    metrics,
    log,
    migrationLimit,
    preemptionLimit,
    releaseKv: (kv) => upstream.releaseKv(kv),
  };

  /**
   * Streams a response: every lane has a worker before the headers go out; the one finally closes
   * the lanes (each releases its worker once), however this ends. A sequence that breaks and that
   * no worker can continue ends the response with an error event saying why; nothing is ever cut
   * without one. The headers leave with the first tokens, and a single lane's last tokens with the
   * end: one system call each, or one in all when the first read held the whole answer.
   */
  async function stream(reply: StreamReply, fmt: StreamFormat, gens: GenerateBody[], n: number, signal: AbortSignal, started: number, kept?: StreamTap, resumed?: Resumed[]): Promise<void> {
    // A takeover continues each sequence from what the other frontend delivered; its opening went out with that.
    const lanes = await openLanes(gens, ctx, signal, resumed);
    const res = reply.raw;
    // A kept stream is given every byte too: it goes on (and is resumable) when its client leaves.
    const out = new ClientStream(res, clientWriteTimeoutMs, kept);
    // One lane failing stops the others: the response ends once, with the error.
    const stop = new AbortController();
    const laneSignal = gens.length === 1 ? signal : AbortSignal.any([signal, stop.signal]);
    // A single lane's last tokens wait for the end, to leave with it.
    const linger = lanes.length === 1;
    const runLane = async (lane: Lane) => {
      try {
        const done = await lane.run(laneSignal);
        if (!linger) lane.flush();
        kept?.laneDone?.(lane.index, done);
        return done;
      } catch (err) {
        stop.abort(err);
        throw err;
      }
    };
    // Its first tokens are here (every lane has a worker and its first batch): they leave now.
    const firstAt = performance.now();
    try {
      // A takeover's first tokens are not its client's first: they were sent by another frontend.
      if (resumed === undefined) metrics.firstToken((firstAt - started) / 1000, gens[0]!);
      reply.hijack();
      out.cork();
      // A takeover whose every sequence had finished runs on no worker: it only writes the end.
      out.begin(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', ...(lanes.length > 0 && { 'x-ebb-worker-id': headerValue(lanes[0]!.workerId) }) });
      if (resumed === undefined) out.write(fmt.opening());
      for (const lane of lanes) {
        lane.start(new LaneWriter(out, lane.index, fmt, lane.delivered));
        lane.flush();
      }
      // Answers that came whole (every done line already read) stay corked: the end below follows
      // within this turn, and the whole response leaves in one system call instead of two.
      if (!lanes.every((lane) => lane.answered)) out.uncork();
      const running = new Map(lanes.map((lane) => [lane.index, lane]));
      // A sequence another frontend saw finish (a takeover): its finish waits for the end, as it did there.
      const ends = await Promise.all(gens.map((_, index) => (running.has(index) ? runLane(running.get(index)!) : resumed![index]!.done!)));
      // Stopped as it finished (its client left, a kept stream's cut or lost lease): whoever stopped it writes its end.
      if (signal.aborted) return;
      out.cork();
      for (const lane of lanes) lane.flush();
      // The finishes in choice order, made now: event ids rise along the stream (a resuming client relies on it).
      const usage = sumLanes(ends.map((e) => e.usage), n);
      out.end(ends.map((done, index) => fmt.finished(index, done.finishReason)).join('') + fmt.end(usage));
      metrics.generated(gens[0]!, usage, gens.length, resumed === undefined ? firstAt : undefined);
    } catch (err) {
      if (!signal.aborted) fail(out, lanes, err, fmt, gens[0]!);
    } finally {
      for (const lane of lanes) lane.close();
      // The client left; closing the lanes freed the workers' slots.
      if (signal.aborted && lanes.length > 0) log.info({ event: 'client_gone', worker_id: lanes[0]!.workerId, ...bodyLogIds(gens[0]!) }, `client left a stream on ${lanes[0]!.workerId}`);
    }
  }

  /** Ends a stream that broke: an SSE error event when it had started, a JSON 500 when it never could. */
  function fail(out: ClientStream, lanes: Lane[], err: unknown, fmt: StreamFormat, gen: GenerateBody): void {
    const res = out.res;
    const workerId = lanes[0]?.workerId ?? 'none';
    try {
      if (!res.headersSent) {
        log.error({ event: 'response_failed', worker_id: workerId, err: (err as Error).message, ...bodyLogIds(gen) }, `could not start the response: ${(err as Error).message}`);
        res.writeHead(500, { 'content-type': 'application/json; charset=utf-8' });
        res.end(JSON.stringify(errorBody('internal_error', `could not start the response: ${(err as Error).message}`)));
        return;
      }
      const failure = lanes[0]?.failure(err) ?? new MidStreamFailure(workerId, err);
      metrics.midStreamFailure();
      streamFailed(res, failure.code, failure.message);
      log.warn({ event: 'midstream_failure', worker_id: failure.workerId, code: failure.code, err: failure.message, ...bodyLogIds(gen) }, failure.message);
      out.end(fmt.error(failure.code, failure.message));
    } catch {
      res.destroy();
    }
  }

  /** Non-streaming: nothing reaches the client until every choice is complete; a worker that fails half way is replaced as in a stream. */
  async function collect(gens: GenerateBody[], n: number, signal: AbortSignal, started = performance.now()): Promise<{ choices: CollectedChoice[]; usage: Usage; workerId: string }> {
    const lanes = await openLanes(gens, ctx, signal);
    // Its first tokens came (every lane's first batch): what a stream would have sent now.
    const firstAt = performance.now();
    metrics.firstToken((firstAt - started) / 1000, gens[0]!);
    // One lane failing stops the others, as in a stream.
    const stop = new AbortController();
    const laneSignal = lanes.length === 1 ? signal : AbortSignal.any([signal, stop.signal]);
    try {
      const results = await Promise.all(
        lanes.map(async (lane) => {
          const delivered = lane.delivered;
          // Logprobs of every token, from each worker that served the choice (a migration keeps the delivered ones).
          let logprobs: TokenLogprob[] | undefined;
          const piece = (text: string, ids: number[] | undefined, lp?: TokenLogprob[]) => {
            delivered.add(text, ids);
            if (lp !== undefined) (logprobs ??= []).push(...lp);
          };
          lane.start({ plain: (buf, start, end) => delivered.addBytes(buf, start, end), piece });
          try {
            const done = await lane.run(laneSignal);
            return { text: delivered.text, finishReason: done.finishReason, usage: done.usage, logprobs };
          } catch (err) {
            stop.abort(err);
            throw err;
          }
        }),
      );
      const usage = sumLanes(results.map((r) => r.usage), n);
      metrics.generated(gens[0]!, usage, gens.length, firstAt);
      // The worker that finished the (first) answer, for x-ebb-worker-id.
      return { choices: results, usage, workerId: lanes[0]!.workerId };
    } catch (err) {
      if (err instanceof LaneFailed) throw new EbbError(err.failure.code, err.failure.message);
      throw err;
    } finally {
      for (const lane of lanes) lane.close();
    }
  }

  return { stream, collect };
}

export type Relay = ReturnType<typeof createRelay>;

/** Where a stream is written: a client's reply, or a background response's detached one. */
export interface StreamReply {
  raw: FastifyReply['raw'];
  hijack(): unknown;
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

