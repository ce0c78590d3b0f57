import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Delivered } from './migration.js';
import { HeldBytes, type Release } from './held-bytes.js';
import type { LaneDone } from './lane.js';

const CRLF = 0x0d0a;
const CR = 0x0d;

/** What a kept (resumable) stream takes of a response's body: its bytes, without the HTTP framing. */
export interface StreamTap {
  /**
   * False: the bytes must not go out (the stream is no longer this frontend's to write: another one
   * took it over). True: they go out now. A number: they wait for the fleet's copy to hold them, and
   * go out at the first release past that mark (see onRelease).
   */
  append(payload: Buffer): boolean | number;
  /** Told at each release of held bytes, in order. */
  onRelease?(fn: (upTo: Release) => void): void;
  /**
   * Where sequence `lane` stands after the bytes just appended: what it delivered (its model's raw
   * text, before any tool-call parsing, and its tokens). Another frontend continues the stream from it.
   */
  progress?(lane: number, delivered: Delivered): void;
  /** Sequence `lane` finished (its finish event waits for the response's end). */
  laneDone?(lane: number, done: LaneDone): void;
  /**
   * The last bytes; false, as for append: they must not go out (the response stays open for what its
   * owner writes instead); a number, as for append: the response ends at that mark's release (a
   * release that drops them leaves it open for its owner).
   */
  end(payload: Buffer): boolean | number;
}

/** How long a streaming client may leave its socket full (reading nothing) before it is disconnected. */
export const DEFAULT_CLIENT_WRITE_TIMEOUT_MS = 30_000;

/**
 * A streamed response's body, once its headers are out. Each write is one Buffer written straight
 * to the socket, with its HTTP/1.1 chunk framing built in: ServerResponse.write would cork the
 * socket, queue three writes (size, data, CRLF) and uncork on the next tick, for every write. The
 * response itself still ends through ServerResponse (end()), which writes the last chunk and the
 * terminator and keeps the connection's keep-alive bookkeeping right.
 */
export class ClientStream {
  /** The response's socket, taken while the request is open (ServerResponse lets go of it once finished). */
  private readonly socket: Socket | null;
  private chunked = false;
  private drainWaiters: Array<() => void> = [];
  /** Armed while the socket is full: a client that reads nothing for writeTimeoutMs is cut. */
  private stall: NodeJS.Timeout | undefined;
  private readonly onDrain = () => {
    clearTimeout(this.stall);
    const waiters = this.drainWaiters;
    this.drainWaiters = [];
    for (const w of waiters) w();
  };

  /** Bytes waiting for the fleet's copy. */
  private readonly held = new HeldBytes();
  private listening = false;
  /** The response's last bytes, waiting for the fleet's copy too: the response ends at their release. */
  private heldEnd: { last: Buffer; mark: number } | undefined;
  private readonly release = (upTo: Release) => {
    const out = this.held.take(upTo);
    const socket = this.socket;
    if (out.length > 0 && socket !== null && !socket.destroyed) {
      if (out.length > 1) socket.cork();
      for (const buf of out) socket.write(buf);
      if (out.length > 1) socket.uncork();
    }
    const end = this.heldEnd;
    if (end === undefined || (upTo !== 'drop' && upTo < end.mark)) return;
    this.heldEnd = undefined;
    if (upTo !== 'drop') this.res.end(end.last);
  };

  constructor(
    readonly res: ServerResponse,
    private readonly writeTimeoutMs = DEFAULT_CLIENT_WRITE_TIMEOUT_MS,
    /** A kept stream (resumable): every byte of the body is given to it too, the client there or not. */
    readonly tap?: StreamTap,
  ) {
    this.socket = res.socket;
  }

  /** Sends the headers now, so body writes can go to the socket behind them. */
  begin(status: number, headers: Record<string, string>): void {
    this.res.writeHead(status, headers);
    this.res.flushHeaders();
    // HTTP/1.0 clients get the body unframed, then the connection closes (ServerResponse decided so).
    this.chunked = (this.res as unknown as { chunkedEncoding: boolean }).chunkedEncoding;
  }

  /** Writes until uncork() leave in one system call (the headers with the first tokens, the last tokens with the end). */
  cork(): void {
    this.socket?.cork();
  }

  uncork(): void {
    this.socket?.uncork();
  }

  /** A buffer for `size` body bytes, to be filled from `at` and given to send(). */
  alloc(size: number): { buf: Buffer; at: number } {
    if (!this.chunked) return { buf: Buffer.allocUnsafe(size), at: 0 };
    const hex = size.toString(16);
    const buf = Buffer.allocUnsafe(hex.length + 2 + size + 2);
    buf.write(hex, 0, 'latin1');
    buf.writeUInt16BE(CRLF, hex.length);
    buf.writeUInt16BE(CRLF, hex.length + 2 + size);
    return { buf, at: hex.length + 2 };
  }

  /** false: the socket's buffer is full; whenDrained says when to write again. */
  send(buf: Buffer): boolean {
    if (this.tap !== undefined) {
      const go = this.tap.append(this.chunked ? buf.subarray(buf.indexOf(CR) + 2, buf.length - 2) : buf);
      if (go === false) return true;
      if (go !== true || this.held.size > 0) return this.hold(buf, go === true ? 0 : go);
    }
    const socket = this.socket;
    if (socket === null || socket.destroyed) return true; // the client left: the relay's signal ends it
    return socket.write(buf);
  }

  /** Bytes that wait for the fleet's copy; false (as for send) while the socket is still full from the last release. */
  private hold(buf: Buffer, mark: number): boolean {
    this.listen();
    this.held.hold(buf, mark);
    return this.socket === null || !this.socket.writableNeedDrain;
  }

  private listen(): void {
    if (this.listening) return;
    this.listening = true;
    this.tap!.onRelease?.(this.release);
  }

  write(text: string | Buffer): boolean {
    if (text.length === 0) return true;
    const size = typeof text === 'string' ? Buffer.byteLength(text) : text.length;
    const { buf, at } = this.alloc(size);
    if (typeof text === 'string') buf.write(text, at, size, 'utf8');
    else text.copy(buf, at);
    return this.send(buf);
  }

  /**
   * Runs `fn` once the socket drained (never, when it closes first: the relay's signal covers that).
   * A client that takes nothing for writeTimeoutMs is disconnected: its request ends as a client that
   * left, and its worker's slot is freed (it held both for as long as it did not read). Armed once
   * per full socket, not per write.
   */
  whenDrained(fn: () => void): void {
    if (this.drainWaiters.push(fn) !== 1) return;
    const socket = this.socket;
    socket?.once('drain', this.onDrain);
    // A kept stream outlives its client: a socket that closes full must not hold the generation's reads.
    if (this.tap !== undefined) socket?.once('close', this.onDrain);
    // Cleared by the drain; after a close, destroying again is a no-op.
    if (socket && this.writeTimeoutMs > 0) this.stall = setTimeout(() => socket.destroy(), this.writeTimeoutMs).unref();
  }

  /** Ends the response; ServerResponse.end also fully uncorks the socket. */
  end(text: string | Buffer): void {
    if (this.tap === undefined) return void this.res.end(text);
    // Encoded once, for the kept stream and the client alike.
    const last = typeof text === 'string' ? Buffer.from(text) : text;
    const go = this.tap.end(last);
    if (go === false) return this.uncork();
    if (go === true) return void this.res.end(last);
    // It waits for the fleet's copy, behind what is held: released, the response ends; dropped, its owner writes instead.
    this.uncork();
    this.listen();
    this.heldEnd = { last, mark: go };
  }
}
