import type { Logger } from 'pino';
import { EbbError, type ErrorCode } from '../../protocol/errors.js';
import type { Relay, StreamReply } from '../relay/relay.js';
import { Shutdown } from '../shutdown.js';
import { detachedResponse } from '../streams/detached-response.js';
import { Abandoned, type KeptStream } from '../streams/kept-stream.js';
import type { TakenStream } from '../streams/shared-streams.js';
import { LeaseLost } from '../streams/stream-lease.js';
import type { StreamStore } from '../streams/stream-store.js';
import type { StreamFormat } from '../wire/stream-format.js';
import { ResponseCancelled } from './response-store.js';
import { replayedFormat, streamFormat, type StreamPlan } from './stream-plan.js';
import { bodyTraceparent, endTakeover, keepTrace, startTakeover } from '../../tracing/frontend-spans.js';
import { streamFailed } from '../request-outcome.js';

/** The header a client sends when it will resume a cut stream (`@ebb/client` sends it); a kept stream's answer carries it back. */
export const RESUMABLE_HEADER = 'x-ebb-resumable';

/** The path a kept response is resumed at (GET, with Last-Event-ID or starting_after). */
export function resumePath(plan: Pick<StreamPlan, 'endpoint' | 'id'>): string {
  const path = plan.endpoint === 'responses' ? 'responses' : plan.endpoint === 'chat' ? 'chat/completions' : 'completions';
  return `/v1/${path}/${plan.id}`;
}

/**
 * The last event of a kept stream this frontend lets go of while it runs (its shutdown deadline, a
 * lease lost to another frontend): an error every SDK raises, carrying where to resume it (any
 * frontend of the fleet continues it). It has no id: it is not one of the stream's events.
 */
export function handOnEvent(plan: Pick<StreamPlan, 'endpoint' | 'id'>, last: number): string {
  const resume = { response_id: plan.id, last_event_id: last, url: `${resumePath(plan)}?stream=true&starting_after=${last}` };
  // The resume point in the words too: some SDKs pass on only an error's message and code.
  const message = `this frontend let go of the stream: resume it after event ${last} (GET ${resume.url}, or with Last-Event-ID: ${last}) at any frontend of the fleet`;
  const error = { message, type: 'server_error', param: null, code: 'stream_interrupted', resume };
  // A Responses event carries a sequence number: the resume point's (the last the client has), so a reader skips nothing.
  if (plan.endpoint === 'responses') return `event: error\ndata: ${JSON.stringify({ type: 'error', sequence_number: last, code: error.code, message, param: null, resume, error })}\n\n`;
  return `data: ${JSON.stringify({ error })}\n\n`;
}

/** How a streamed response ended, for whoever keeps its record (the Responses API). */
export type Ended = (fmt: StreamFormat, reason: unknown) => void;

export interface StreamOutDeps {
  relay: Relay;
  /** Where streams are kept for resumption; none: every stream ends with its connection. */
  store?: StreamStore | undefined;
  log: Logger;
  /** Told of every stream this frontend takes over (the Responses API keeps a record of it here). */
  adopted?: ((plan: StreamPlan, kept: KeptStream, fmt: StreamFormat) => Ended | undefined) | undefined;
}

/** What a stream holds until its generation is over: its lanes' room (released on the reply's close, or once the kept generation ends). */
export interface Room {
  keepUntil(over: Promise<void>): void;
}

/**
 * Streaming a response to its client: kept (resumable) or not, and continuing one taken over from
 * another frontend. The one place that decides how a kept stream ends: its end, an error event
 * (cancelled, abandoned, failed), or a hand-on (the client resumes at another frontend).
 */
export function createStreamOut({ relay, store, log, adopted }: StreamOutDeps) {
  /**
   * Streams `plan`'s response on `reply`. Kept (`keep`, or a background response: `signal` is then
   * none of a client's), each event is numbered, its generation outlives its client by the store's
   * grace, and at the shutdown deadline it is handed on; not kept, its client leaving cancels it at once.
   */
  async function stream(reply: StreamReply, plan: StreamPlan, fmt: StreamFormat, signal: AbortSignal, started: number, room: Room, opts: { keep: boolean; background?: boolean; tenant: string; ended?: Ended | undefined; onKept?: (kept: KeptStream) => void }): Promise<void> {
    if (!opts.keep || store === undefined) {
      try {
        await relay.stream(reply, fmt, plan.gens, plan.n, signal, started);
      } finally {
        opts.ended?.(fmt, signal.reason);
      }
      Shutdown.endCutStream(reply.raw, fmt, signal);
      return;
    }
    // The trace goes with the copy: a frontend that takes the stream over continues it.
    plan.traceparent ??= bodyTraceparent(plan.gens[0]!);
    keepTrace(plan.id, plan.traceparent);
    const kept = store.open(plan.id, opts.tenant, () => JSON.stringify(plan));
    opts.onKept?.(kept);
    reply.raw.setHeader(RESUMABLE_HEADER, '1');
    room.keepUntil(kept.over);
    if (opts.background === true) kept.detach();
    else kept.watch(signal);
    if (opts.background === true) await kept.lease?.opened;
    await run(reply, plan, fmt, kept, started, undefined, opts.ended);
  }

  /**
   * A stream whose frontend is gone, continued here from its copy: the same ids, the same format,
   * each unfinished sequence continued on a worker (`cancel`: stopped at once instead, as its
   * client asked). False when its plan cannot be read.
   */
  async function continueTaken(taken: TakenStream, opts: { cancel?: boolean }): Promise<boolean> {
    if (store === undefined || taken.plan === '') return false;
    const plan = JSON.parse(taken.plan) as StreamPlan;
    const kept = store.adopt(taken);
    const nothingKept = taken.copy.events.length === 0;
    // Nothing of it was copied (its frontend died in its first batch): it starts afresh, its opening first.
    const fmt = nothingKept ? streamFormat(plan, true) : replayedFormat(plan, taken.resumed, taken.copy.maxId);
    const ended = adopted?.(plan, kept, fmt);
    if (opts.cancel === true) {
      kept.stop(Buffer.from(fmt.error('cancelled', `response ${plan.id} was cancelled`)));
      ended?.(fmt, new ResponseCancelled(plan.id));
      return true;
    }
    const detached = { raw: detachedResponse(), hijack: () => undefined };
    // In the trace of the request that started it (its span on the frontend that is gone), its attempts under it.
    const span = startTakeover(plan.traceparent, plan.gens, plan.id, taken.copy.maxId + 1);
    void run(detached, plan, fmt, kept, performance.now(), nothingKept ? undefined : taken.resumed, ended).then(
      () => span && endTakeover(span),
      (err: unknown) => {
        if (span) endTakeover(span, { code: 'takeover_failed', message: (err as Error).message });
        log.warn({ event: 'takeover_failed', response_id: plan.id, err: (err as Error).message }, `continuing ${plan.id} failed: ${(err as Error).message}`);
      },
    );
    return true;
  }

  async function run(reply: StreamReply, plan: StreamPlan, fmt: StreamFormat, kept: KeptStream, started: number, resumed: TakenStream['resumed'] | undefined, ended: Ended | undefined): Promise<void> {
    let failed: unknown;
    try {
      await relay.stream(reply, fmt, plan.gens, plan.n, kept.signal, started, kept, resumed);
      // An end that waits for the fleet's copy: sent, or refused because another frontend holds the stream now (concluded as a lost lease).
      await kept.endSettled;
      await conclude(reply, plan, fmt, kept);
    } catch (err) {
      failed = Shutdown.cutReason(kept.signal) ?? err;
      throw failed;
    } finally {
      // Failed before its first byte (refused, no worker): forgotten, as if never kept (its answer is the error).
      if (kept.keptBytes === 0 && kept.current === 'live') store!.discard(kept, fmt.error('stream_lost', 'the request failed before it started'));
      // Stopped without an end written (an error the relay could not write; a background response refused before it started): followers still get one, saying why where it is known.
      else if (kept.current === 'live') kept.stop(Buffer.from(failed instanceof EbbError ? fmt.error(failed.code, failed.message) : fmt.error('stream_lost', `response ${plan.id} stopped unfinished`)));
      ended?.(fmt, kept.signal.reason);
    }
  }

  /** A kept stream's generation stopped: its last event, for its client and every follower, by why it stopped. */
  async function conclude(reply: StreamReply, plan: StreamPlan, fmt: StreamFormat, kept: KeptStream): Promise<void> {
    if (kept.current !== 'live') return;
    const reason = kept.signal.reason as unknown;
    const cut = Shutdown.cutReason(kept.signal);
    const toClient = (text: string) => {
      if (reply.raw.headersSent && !reply.raw.writableEnded) reply.raw.end(text);
    };
    if (reason instanceof LeaseLost || cut?.code === 'server_closing') {
      // Past this frontend's shutdown deadline, or another frontend holds it now: the client resumes there.
      const last = await kept.handOn((at) => Buffer.from(handOnEvent(plan, at)));
      if (last !== undefined) {
        log.info({ event: 'stream_handed_on', response_id: plan.id, last_event_id: last, why: cut !== undefined ? 'shutdown' : 'lease_lost' }, `stream ${plan.id} handed on after event ${last}: its client resumes at another frontend`);
        return toClient(handOnEvent(plan, last));
      }
    }
    const ending: { code: ErrorCode; message: string } | undefined =
      cut !== undefined
        ? cut
        : reason instanceof ResponseCancelled
          ? { code: 'cancelled', message: reason.message }
          : reason instanceof Abandoned
            ? { code: 'stream_abandoned', message: reason.message }
            : reason instanceof EbbError
              ? reason
              : undefined;
    if (ending === undefined) return;
    streamFailed(reply.raw, ending.code, ending.message);
    const why = fmt.error(ending.code, ending.message);
    kept.stop(Buffer.from(why), reason instanceof Abandoned);
    toClient(why);
  }

  return { stream, continueTaken };
}

export type StreamOut = ReturnType<typeof createStreamOut>;
