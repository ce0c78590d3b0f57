import type { Dispatcher } from 'undici';
import type { StreamLine, TokenLogprob } from '../../protocol/request-plane.js';
import { plainTextStart } from '../wire/token-splice.js';
import { BoundedBytes } from '../../common/bounded-read.js';

const NEWLINE = 0x0a;
/** Batches read ahead of a relay that waits on its client; past this the worker's socket is paused. */
const MAX_QUEUED_BATCHES = 16;
/** Most a refusal's or an error's JSON body is read to (they are a few hundred bytes). */
export const MAX_ERROR_BODY = 64 * 1024;
/**
 * Longest stream line a worker may send: its lines are a token or a terminal line, well under a
 * KiB. A worker past it without a newline is broken (or not a worker): its request ends.
 */
export const MAX_LINE_BYTES = 1024 * 1024;

/** A worker's stream line ran past MAX_LINE_BYTES without its newline. */
export class StreamLineTooLong extends Error {
  constructor() {
    super(`a stream line over ${MAX_LINE_BYTES} bytes without a newline`);
  }
}

/**
 * A text line that needs no unescaping, kept as its bytes (buf[start, end) is the text's UTF-8) in a
 * batch read before the call is piped: the first batch of a short answer holds every token, and
 * parsing each line only to serialise its text again was most of what such a token cost.
 */
export class PlainLine {
  constructor(
    readonly buf: Buffer,
    readonly start: number,
    readonly end: number,
  ) {}
}

/** One line of a batch: parsed, or a plain text line as bytes. */
export type BatchLine = StreamLine | PlainLine;

const isFinal = (l: BatchLine) => !(l instanceof PlainLine) && ('done' in l || 'error' in l || 'handoff' in l);

/** Where a piped call's text lines go, synchronously, as each network read is parsed. */
export interface TokenSink {
  /** A text line that needs no unescaping: buf[start, end) is its text's UTF-8. */
  plain(buf: Buffer, start: number, end: number): void;
  /** Any other text line, parsed (escapes, token ids, logprobs). */
  piece(text: string, tokenIds: number[] | undefined, logprobs?: TokenLogprob[]): void;
  /** The terminal line was read (pipe() settles with it next). */
  final?(): void;
}

/** Lines already parsed into `sink`, up to the terminal line, which is returned (undefined when none is among them). */
export function feedLines(lines: BatchLine[], sink: TokenSink): StreamLine | undefined {
  for (const line of lines) {
    if (line instanceof PlainLine) sink.plain(line.buf, line.start, line.end);
    else if (isFinal(line)) return line;
    else piece(line, sink);
  }
  return undefined;
}

/** A parsed text line (not a terminal one) into `sink`. */
function piece(line: StreamLine, sink: TokenSink): void {
  const t = line as { text: string; token_ids?: number[]; logprobs?: TokenLogprob[] };
  sink.piece(t.text, t.token_ids, t.logprobs);
}

/** Closed by the frontend on purpose (a release before the final line). */
export class CallReleased extends Error {
  constructor() {
    super('released by the frontend');
  }
}

/**
 * One POST to a worker, read through undici's dispatcher handler API: no Readable, no string
 * decoder, no async iterator. Two ways to read it:
 * - next(): each network read's complete lines parsed into one batch (text lines that need no
 *   unescaping kept as their bytes), handed to whoever waits or queued (up to MAX_QUEUED_BATCHES, then the socket is paused until the reader catches up). The
 *   first batch is read so, before anything is committed to the client.
 * - pipe(sink): from then on every text line goes to the sink synchronously, while the read is
 *   parsed (plain ones as bytes, unparsed), and one promise settles with the terminal line.
 * A body that ended on its own is never aborted, so the success path builds no error and the
 * socket stays pooled.
 */
/** The retry-after value among undici's raw header pairs. */
function retryAfterOf(headers: Buffer[] | string[] | null): string | undefined {
  if (headers === null) return undefined;
  for (let i = 0; i + 1 < headers.length; i += 2) if (String(headers[i]).toLowerCase() === 'retry-after') return String(headers[i + 1]);
  return undefined;
}

export class WorkerCall implements Dispatcher.DispatchHandler {
  statusCode = 0;
  /** A refusal's Retry-After (a draining worker's ETA), read only off a non-200 head. */
  retryAfter: string | undefined;
  /** The terminal line (done, error, handoff) has been read. */
  final = false;
  /** Set on every network read; the idle watch clears it (a flag, not a timer re-armed per read). */
  sawBytes = false;
  /** Settles when the response body is done with: true when it ended normally, false when cut. */
  readonly closed: Promise<boolean>;
  /** Resolves with the status once the response head arrived; rejects when the call failed before it. */
  readonly head: Promise<number>;

  private abortFn: ((err: Error) => void) | undefined;
  private resumeFn: (() => void) | undefined;
  /** onData returned false: the parser waits for resumeFn. */
  private paused = false;
  /** The piped reader asked for no more reads until its client drains. */
  private held = false;
  /** The start of a line whose newline has not come yet. */
  private readonly partial = new BoundedBytes(MAX_LINE_BYTES);
  private readonly queue: BatchLine[][] = [];
  private waiter: { resolve: (r: IteratorResult<BatchLine[], void>) => void; reject: (err: unknown) => void } | undefined;
  private sink: TokenSink | undefined;
  private piped: { resolve: (line: StreamLine | undefined) => void; reject: (err: unknown) => void } | undefined;
  private ended = false;
  private failure: unknown;
  private errorBody: BoundedBytes | undefined;
  private settleClosed!: (ended: boolean) => void;
  private headResolve!: (status: number) => void;
  private headReject!: (err: unknown) => void;
  private readonly onAbort: (() => void) | undefined;
  private pendingAbort: Error | undefined;

  constructor(private readonly signal?: AbortSignal) {
    this.closed = new Promise((resolve) => (this.settleClosed = resolve));
    this.head = new Promise((resolve, reject) => {
      this.headResolve = resolve;
      this.headReject = reject;
    });
    this.head.catch(() => undefined);
    if (signal) {
      this.onAbort = () => this.abort(signal.reason instanceof Error ? signal.reason : new Error('aborted'));
      signal.addEventListener('abort', this.onAbort, { once: true });
    }
  }

  /** Starts the call on `dispatcher`. */
  static start(dispatcher: Dispatcher, opts: Dispatcher.DispatchOptions, signal?: AbortSignal): WorkerCall {
    const call = new WorkerCall(signal);
    if (signal?.aborted) call.onError(signal.reason instanceof Error ? signal.reason : new Error('aborted'));
    else dispatcher.dispatch(opts, call);
    return call;
  }

  /** Cuts the call (a no-op once it ended): what frees the worker's slot when the relay lets go early. */
  abort(err: Error = new CallReleased()): void {
    if (this.ended || this.failure !== undefined) return;
    if (this.abortFn) this.abortFn(err);
    else this.pendingAbort = err;
  }

  // --- Dispatcher.DispatchHandler (undici's handler API, called by the connection) ---

  onConnect(abort: (err?: Error) => void): void {
    this.abortFn = abort;
    if (this.pendingAbort) abort(this.pendingAbort);
  }

  onHeaders(statusCode: number, headers: Buffer[] | string[] | null, resume: () => void): boolean {
    this.statusCode = statusCode;
    this.resumeFn = resume;
    if (statusCode !== 200) {
      this.errorBody = new BoundedBytes(MAX_ERROR_BODY);
      this.retryAfter = retryAfterOf(headers);
    }
    this.headResolve(statusCode);
    return true;
  }

  onData(chunk: Buffer): boolean {
    if (this.errorBody) {
      this.errorBody.push(chunk, true);
      return true;
    }
    this.sawBytes = true;
    if (this.final) return true; // after the terminal line: nothing the relay wants; let the body end
    let buf = chunk;
    let last = buf.lastIndexOf(NEWLINE);
    if (last < 0) return this.partial.push(buf) || this.lineTooLong();
    if (this.partial.size > 0) {
      // The held start and this read joined once, when its line is complete.
      if (this.partial.size + buf.indexOf(NEWLINE) > MAX_LINE_BYTES) return this.lineTooLong();
      last += this.partial.size;
      buf = Buffer.concat([this.partial.take(), buf]);
    }
    const sink = this.sink;
    const batch: BatchLine[] | undefined = sink ? undefined : [];
    let start = 0;
    while (start <= last) {
      const end = buf.indexOf(NEWLINE, start);
      if (end > start) {
        const plain = plainTextStart(buf, start, end);
        if (plain >= 0) {
          if (sink) sink.plain(buf, plain, end - 2);
          else batch!.push(new PlainLine(buf, plain, end - 2));
        } else {
          let line: StreamLine;
          try {
            line = JSON.parse(buf.toString('utf8', start, end)) as StreamLine;
          } catch (err) {
            this.fail(err);
            return false;
          }
          if (this.take(line, batch)) break;
        }
      }
      start = end + 1;
    }
    if (!this.final && last + 1 < buf.length && !this.partial.push(buf.subarray(last + 1))) return this.lineTooLong();
    if (batch && batch.length > 0) this.push(batch);
    if (this.held || this.queue.length >= MAX_QUEUED_BATCHES) {
      this.paused = true;
      return false;
    }
    return true;
  }

  onComplete(): void {
    this.ended = true;
    this.detach();
    const rest = this.partial.take().toString('utf8');
    if (this.errorBody === undefined && !this.final && rest.trim().length > 0) {
      try {
        const line = JSON.parse(rest) as StreamLine;
        const batch: BatchLine[] | undefined = this.sink ? undefined : [];
        this.take(line, batch);
        if (batch) this.push(batch);
      } catch (err) {
        this.failure = err;
      }
    }
    this.settleClosed(true);
    this.wake();
  }

  onError(err: Error): void {
    this.detach();
    this.failure ??= err;
    this.headReject(err);
    this.settleClosed(false);
    this.wake();
  }

  // --- what the upstream reads ---

  /** The JSON body of a non-200 answer ({} when it is not JSON). */
  async json(): Promise<unknown> {
    await this.closed;
    try {
      return JSON.parse(this.errorBody?.take().toString('utf8') ?? '');
    } catch {
      return {};
    }
  }

  next(): Promise<IteratorResult<BatchLine[], void>> {
    const batch = this.queue.shift();
    if (batch) {
      if (this.paused && this.queue.length < MAX_QUEUED_BATCHES / 2) this.resumeReads();
      return Promise.resolve({ value: batch, done: false });
    }
    if (this.failure !== undefined) return Promise.reject(this.failure);
    if (this.ended) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve, reject) => (this.waiter = { resolve, reject }));
  }

  /**
   * Hands every text line from here on to `sink` (the batches already queued first) and settles
   * with the terminal line: undefined when the body ended without one, a rejection when the call
   * failed. Lines read before a failure have reached the sink.
   */
  pipe(sink: TokenSink): Promise<StreamLine | undefined> {
    for (let batch = this.queue.shift(); batch; batch = this.queue.shift()) {
      const end = feedLines(batch, sink);
      if (end !== undefined) return Promise.resolve(end);
    }
    if (this.failure !== undefined) return Promise.reject(this.failure);
    if (this.ended) return Promise.resolve(undefined);
    const settled = new Promise<StreamLine | undefined>((resolve, reject) => (this.piped = { resolve, reject }));
    this.sink = sink;
    // Resuming parses what is buffered at once, which may end the body: the promise exists first.
    if (this.paused) this.resumeReads();
    return settled;
  }

  /** No more reads until resumeReads(): the piped reader's client is not keeping up. */
  holdReads(): void {
    this.held = true;
  }

  resumeReads(): void {
    this.held = false;
    if (!this.paused) return;
    this.paused = false;
    this.resumeFn?.();
  }

  /**
   * A parsed line into the batch being built or, when piped (no batch), to the sink; a terminal
   * line ends the body's reading and settles the pipe. True for a terminal line.
   */
  private take(line: StreamLine, batch: BatchLine[] | undefined): boolean {
    const final = isFinal(line);
    if (final) this.final = true;
    if (batch) batch.push(line);
    else if (final) this.settlePipe(line);
    else piece(line, this.sink!);
    return final;
  }

  private settlePipe(line: StreamLine): void {
    this.sink?.final?.();
    this.sink = undefined;
    const p = this.piped;
    this.piped = undefined;
    p?.resolve(line);
  }

  private push(batch: BatchLine[]): void {
    const w = this.waiter;
    if (w) {
      this.waiter = undefined;
      w.resolve({ value: batch, done: false });
    } else this.queue.push(batch);
  }

  /** Ends the call: the line being read has no end in sight. */
  private lineTooLong(): false {
    this.partial.take();
    this.fail(new StreamLineTooLong());
    return false;
  }

  private fail(err: unknown): void {
    this.failure = err;
    this.abortFn?.(err as Error);
  }

  private wake(): void {
    const p = this.piped;
    if (p) {
      this.piped = undefined;
      this.sink = undefined;
      if (this.failure !== undefined) p.reject(this.failure);
      else p.resolve(undefined);
    }
    const w = this.waiter;
    if (!w || this.queue.length > 0) return;
    this.waiter = undefined;
    if (this.failure !== undefined) w.reject(this.failure);
    else w.resolve({ value: undefined, done: true });
  }

  private detach(): void {
    if (this.onAbort) this.signal?.removeEventListener('abort', this.onAbort);
  }
}
