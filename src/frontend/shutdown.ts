import type { ServerResponse } from 'node:http';
import { EbbError } from '../protocol/errors.js';
import type { StreamFormat } from './wire/stream-format.js';

/** Default --shutdown-grace-ms: about what endpoint controllers and proxies take to stop sending to a terminating pod. */
export const DEFAULT_SHUTDOWN_GRACE_MS = 5_000;

/**
 * Default --shutdown-timeout-ms: how long open streams may finish after SIGTERM. An agent's turn
 * streams for minutes, and a plain stream still open at the deadline is lost to its client (a kept
 * one is handed on to another frontend), while a frontend whose streams ended exits at once: the
 * bound costs nothing until streams are that long. Supervisors must wait longer than grace + this
 * (Kubernetes' terminationGracePeriodSeconds, systemd's TimeoutStopSec), or they kill it first.
 */
export const DEFAULT_SHUTDOWN_TIMEOUT_MS = 300_000;

/** A Ctrl-C (SIGINT) is someone at a terminal: open streams get at most this long, not minutes. */
export const INTERACTIVE_SHUTDOWN_TIMEOUT_MS = 10_000;

/** The deadline a stop by `signal` gets: the configured one, capped for an interactive SIGINT. */
export function shutdownTimeoutFor(signal: string, configuredMs: number): number {
  return signal === 'SIGINT' ? Math.min(configuredMs, INTERACTIVE_SHUTDOWN_TIMEOUT_MS) : configuredMs;
}

/** How long requests ended at the deadline get to write their answer before their connections are cut. */
const ANSWER_BOUND_MS = 1_000;

/**
 * The frontend's requests on the way out. On SIGTERM readiness fails first (`notReady`: /health
 * answers 503) while the listeners still accept and serve, so load balancers stop sending before
 * anything is refused; at the shutdown deadline every request still open is ended with an answer
 * instead of a bare connection close: an SSE error event in a stream, a 503 JSON error before one.
 */
export class Shutdown {
  /** Set at SIGTERM: readiness fails from then on. */
  notReady = false;
  /** Each open generating request's controller: a map, not listeners on one signal (thousands of streams). */
  private readonly open = new Map<ServerResponse, AbortController>();
  private cut: EbbError | undefined;
  private emptied: (() => void) | undefined;

  /**
   * A generating request's signal: aborted with "client disconnected" when its client leaves, or
   * with the server_closing error at the deadline. The request counts as open until its response closes.
   */
  requestSignal(res: ServerResponse): AbortSignal {
    const controller = new AbortController();
    if (this.cut) controller.abort(this.cut);
    this.open.set(res, controller);
    res.once('close', () => {
      this.open.delete(res);
      if (this.open.size === 0) this.emptied?.();
      if (!res.writableFinished) controller.abort(new Error('client disconnected'));
    });
    return controller.signal;
  }

  /** The error a request cut at the deadline ends with; undefined for any other end (its client left). */
  static cutReason(signal: AbortSignal): EbbError | undefined {
    return signal.aborted && signal.reason instanceof EbbError ? signal.reason : undefined;
  }

  /**
   * Ends a stream the deadline cut with the error event saying why (the relay stays quiet about an
   * aborted stream, which is right when its client left but not when the client is still there).
   */
  static endCutStream(res: ServerResponse, fmt: StreamFormat, signal: AbortSignal): void {
    const reason = Shutdown.cutReason(signal);
    if (!reason || !res.headersSent || res.writableEnded) return;
    res.end(fmt.error(reason.code, reason.message));
  }

  get openRequests(): number {
    return this.open.size;
  }

  /** Ends every open request with server_closing; resolves once all have answered (bounded: a client that never reads). */
  async cutOpen(message: string): Promise<void> {
    // No Retry-After: this process is going away; when another serves its address is not known here.
    const cut = (this.cut = new EbbError('server_closing', message));
    for (const controller of this.open.values()) controller.abort(cut);
    if (this.open.size === 0) return;
    let timer: NodeJS.Timeout | undefined;
    await new Promise<void>((resolve) => {
      this.emptied = resolve;
      timer = setTimeout(resolve, ANSWER_BOUND_MS);
    });
    clearTimeout(timer);
  }
}
