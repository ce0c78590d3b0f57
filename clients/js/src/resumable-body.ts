/**
 * The body of one ebb stream as the SDK reads it: the events of the first connection, and after a
 * cut the events of each resume spliced on, whole, with no seam the SDK can see.
 */
import { handOnResponseId, responseIdOf, roleOf, type StreamTarget } from './ebb-streams.js';
import { pause, requestResume } from './resume-request.js';
import { SseFramer, type SseEvent } from './sse-events.js';

/** Why a stream needed resuming. */
export type CutCause =
  /** A frontend handed the stream on (its error event with `resume`). */
  | 'handed_on'
  /** The connection failed mid-body. */
  | 'connection_lost'
  /** The body ended before the stream's end event. */
  | 'ended_early';

/** One resume try, told to `onResume`. */
export interface ResumeEvent {
  /** The stream's response id (`chatcmpl-…`, `cmpl-…`, `resp_…`); none when a POST was cut before it said one. */
  responseId: string | undefined;
  /** The last event the client has whole (the resume's `Last-Event-ID`); none when it has none yet. */
  lastEventId: string | undefined;
  cause: CutCause;
  /** 1 for the first try after a cut (or after a resumed connection that delivered events); 0: not tried. */
  attempt: number;
  /** `resumed`: the stream goes on; `retrying`: this try failed, another follows; `gave_up`: the SDK gets the original error. */
  outcome: 'resumed' | 'retrying' | 'gave_up';
  /** The resume answer's HTTP status, when one came. */
  status?: number;
  /** What cut the stream, or what failed this try. */
  error?: unknown;
}

export interface SpliceOptions {
  fetch: typeof fetch;
  retries: number;
  backoffMs(attempt: number): number;
  onResume: ((event: ResumeEvent) => void) | undefined;
  /** The caller's signal: an abort is the caller's, never a cut. */
  signal: AbortSignal | undefined;
  /** The original request's headers (its credentials go with each resume). */
  headers: Headers;
}

/** A stream's body ended before its end event and could not be resumed. */
export class StreamCutError extends Error {
  override readonly name = 'StreamCutError';
}

type Cut =
  | { cause: 'handed_on'; event: SseEvent }
  | { cause: 'connection_lost'; error: unknown }
  | { cause: 'ended_early' };

interface Connection {
  reader: ReadableStreamDefaultReader<Uint8Array>;
  framer: SseFramer;
  /** A resume's connection: the cut it resumes (its events must follow on from the last one passed on). */
  resumes: Cut | undefined;
}

/** How one connection's relay ended. */
type RelayEnd =
  | { kind: 'ended' }
  | { kind: 'cut'; cut: Cut }
  /** A resumed connection whose events do not follow on from the client's last one: the store lost some. */
  | { kind: 'gap'; after: Cut; error: Error };

type BodyState =
  | { kind: 'reading'; connection: Connection }
  | { kind: 'resuming'; cut: Cut }
  | { kind: 'closed' };

const encoder = new TextEncoder();

export class ResumableBody {
  private state: BodyState;
  private responseId: string | undefined;
  private lastEventId: string | undefined;
  /** The stream's end (or an error event it ends with) was passed on: nothing more is owed. */
  private ended = false;
  /** Resume tries since a resumed connection last delivered an event. */
  private tries = 0;
  /** Aborted by the caller's signal or by the SDK cancelling this body: stops resumes and pauses. */
  private readonly stop = new AbortController();
  private readonly detach: () => void;

  constructor(
    private readonly target: StreamTarget,
    body: ReadableStream<Uint8Array>,
    private readonly options: SpliceOptions,
  ) {
    this.responseId = target.responseId;
    this.lastEventId = target.startingAfter;
    this.state = { kind: 'reading', connection: { reader: body.getReader(), framer: new SseFramer(), resumes: undefined } };
    const signal = options.signal;
    const abort = () => this.stop.abort(signal?.reason);
    if (signal?.aborted) abort();
    else signal?.addEventListener('abort', abort, { once: true });
    this.detach = () => signal?.removeEventListener('abort', abort);
  }

  private to(state: BodyState): void {
    this.state = state;
    // A caller's signal may outlive many requests: the closed body lets go of it.
    if (state.kind === 'closed') this.detach();
  }

  /** The body to hand the SDK. */
  stream(): ReadableStream<Uint8Array> {
    const events = this.run();
    return new ReadableStream<Uint8Array>(
      {
        pull: async (controller) => {
          try {
            const next = await events.next();
            if (next.done) controller.close();
            else controller.enqueue(encoder.encode(next.value));
          } catch (error) {
            this.to({ kind: 'closed' });
            controller.error(error);
          }
        },
        cancel: async (reason) => {
          this.stop.abort(reason);
          const state = this.state;
          this.to({ kind: 'closed' });
          if (state.kind === 'reading') await state.connection.reader.cancel(reason).catch(() => undefined);
        },
      },
      // Read on only as the SDK reads: a slow reader holds the connection back, as without this fetch.
      { highWaterMark: 0 },
    );
  }

  private async *run(): AsyncGenerator<string, void, undefined> {
    for (;;) {
      const state = this.state;
      if (state.kind === 'closed') return;
      if (state.kind === 'reading') {
        const end = yield* this.relay(state.connection);
        if (end.kind === 'cut') {
          this.to({ kind: 'resuming', cut: end.cut });
          continue;
        }
        this.to({ kind: 'closed' });
        if (end.kind === 'gap') {
          // The resume answered, but not from where the client is: given up as a refused resume is.
          this.tell({ cause: end.after.cause, attempt: this.tries, outcome: 'gave_up', error: end.error });
          yield* this.original(end.after);
        }
        return;
      }
      const connection = await this.resume(state.cut);
      if (connection === undefined) {
        this.to({ kind: 'closed' });
        yield* this.original(state.cut);
        return;
      }
      this.to({ kind: 'reading', connection });
    }
  }

  /** Passes on one connection's whole events until it ends or is cut. */
  private async *relay(connection: Connection): AsyncGenerator<string, RelayEnd, undefined> {
    const { reader, framer } = connection;
    for (;;) {
      let chunk: Uint8Array;
      try {
        const read = await reader.read();
        if (read.done) return this.ended || this.stop.signal.aborted ? { kind: 'ended' } : { kind: 'cut', cut: { cause: 'ended_early' } };
        chunk = read.value;
      } catch (error) {
        // After the end, what becomes of the connection is no longer the answer's business.
        if (this.ended) return { kind: 'ended' };
        if (this.stop.signal.aborted) throw error;
        return { kind: 'cut', cut: { cause: 'connection_lost', error } };
      }
      for (const event of framer.push(chunk)) {
        const role = roleOf(this.target.api, event);
        if (role === 'hand_on' && !this.ended) {
          this.responseId ??= handOnResponseId(this.target.api, event);
          reader.cancel().catch(() => undefined);
          return { kind: 'cut', cut: { cause: 'handed_on', event } };
        }
        if (event.id !== undefined) {
          if (connection.resumes !== undefined) {
            const order = this.order(event.id);
            if (order === 'seen') continue;
            if (order === 'gap') {
              reader.cancel().catch(() => undefined);
              return { kind: 'gap', after: connection.resumes, error: new Error(`the resumed stream went on at event ${event.id}, after ${this.lastEventId ?? 'none'}: events were lost`) };
            }
          }
          this.lastEventId = event.id;
        }
        this.responseId ??= responseIdOf(this.target.api, event);
        if (role === 'end' || role === 'error_end') this.ended = true;
        if (connection.resumes !== undefined) this.tries = 0;
        yield event.text;
      }
    }
  }

  /** Where a resumed event's id stands: one the client has (`seen`), the next, or beyond it (`gap`). */
  private order(id: string): 'seen' | 'next' | 'gap' {
    const last = this.lastEventId === undefined ? -1 : Number(this.lastEventId);
    const next = Number(id);
    if (!Number.isSafeInteger(last) || !Number.isSafeInteger(next)) return 'next';
    return next <= last ? 'seen' : next === last + 1 ? 'next' : 'gap';
  }

  /** Resumes the stream at the same base URL after its last whole event; undefined when it cannot be. */
  private async resume(cut: Cut): Promise<Connection | undefined> {
    const cutError = cut.cause === 'connection_lost' ? cut.error : undefined;
    // A POST that never said its id may not have started a generation anyone kept; a retry could start a second one.
    if (this.responseId === undefined) {
      this.tell({ cause: cut.cause, attempt: 0, outcome: 'gave_up', error: cutError });
      return undefined;
    }
    const url = this.target.resumeUrl(this.responseId);
    while (this.tries < this.options.retries) {
      const attempt = ++this.tries;
      await pause(this.options.backoffMs(attempt - 1), this.stop.signal);
      const answer = await requestResume(this.options.fetch, url, this.options.headers, this.lastEventId, this.stop.signal);
      if (answer.kind === 'connected') {
        this.tell({ cause: cut.cause, attempt, outcome: 'resumed', status: answer.status });
        return { reader: answer.body.getReader(), framer: new SseFramer(), resumes: cut };
      }
      const more = (answer.kind === 'failed' || !answer.final) && this.tries < this.options.retries;
      const outcome = more ? 'retrying' : 'gave_up';
      if (answer.kind === 'failed') this.tell({ cause: cut.cause, attempt, outcome, error: answer.error });
      else this.tell({ cause: cut.cause, attempt, outcome, status: answer.status, error: cutError });
      if (!more) return undefined;
    }
    this.tell({ cause: cut.cause, attempt: 0, outcome: 'gave_up', error: cutError });
    return undefined;
  }

  /** What the SDK gets when the stream could not be resumed: what cut it, as it came. */
  private async *original(cut: Cut): AsyncGenerator<string, void, undefined> {
    if (cut.cause === 'handed_on') {
      yield cut.event.text;
      return;
    }
    if (cut.cause === 'connection_lost') throw cut.error;
    throw new StreamCutError('the stream ended before its end event, and resuming it failed');
  }

  private tell(event: Omit<ResumeEvent, 'responseId' | 'lastEventId'>): void {
    try {
      this.options.onResume?.({ responseId: this.responseId, lastEventId: this.lastEventId, ...event });
    } catch {
      // A hook that throws must not break the stream it is told about.
    }
  }
}
