import type { Server } from 'node:http';
import { EbbError } from '../../protocol/errors.js';

/**
 * One request fans out to prompts x n sequences (lanes), each holding a socket to a worker: 64
 * prompts x n=16 is 1,024 sockets, enough to exhaust a frontend at `ulimit -n 1024` (EMFILE for
 * everyone, the listener included). Two bounds keep that from happening: lanes per request (a 400,
 * the request can never be served), and file descriptors across the frontend (a retryable 503: it
 * can, once others finish).
 */

/** 64 prompts at n=2, or 8 at n=16; three such requests fit the fd budget of `ulimit -n 1024`. */
export const DEFAULT_MAX_LANES_PER_REQUEST = 128;

/** Descriptors kept out of the budget: listeners, discovery (watched files or etcd), logs, Node's own. */
export const FD_RESERVE = 128;

/**
 * Descriptors requests may hold: the fd limit less the reserve and the admin listener's connection
 * cap. Client connections on the public port and worker sockets share what is left. Undefined where
 * the fd limit is unknown (no /proc): no frontend-wide bound then.
 */
export function fdBudget(fdLimit: number | undefined, adminMaxConnections: number): number | undefined {
  return fdLimit === undefined ? undefined : Math.max(1, fdLimit - FD_RESERVE - adminMaxConnections);
}

export class LaneBudget {
  /** Worker sockets the requests in flight may hold (a disaggregated lane counts two: prefill and decode). */
  private sockets = 0;
  private connections = 0;

  constructor(
    readonly perRequest: number,
    /** Descriptors for client connections and worker sockets together; undefined: unbounded. */
    readonly fds: number | undefined,
  ) {}

  /** Counts the public listener's open connections: each is a descriptor the budget must leave room for. */
  watch(server: Server): void {
    server.on('connection', (socket) => {
      this.connections++;
      socket.once('close', () => this.connections--);
    });
  }

  /**
   * Takes the sockets of one request's `lanes` (`prompts` x `n`), or throws: 400 past the per-request
   * limit or past what the whole budget could ever hold, 503 (retryable) when the descriptors now
   * in use leave too few. The returned release gives them back, once.
   */
  take(lanes: number, socketsPerLane: number, shape: { prompts: number; n: number }): () => void {
    const param = shape.n > 1 ? 'n' : 'prompt';
    const asked = `this request asks for ${lanes} sequences (${shape.prompts} prompt${shape.prompts === 1 ? '' : 's'} x n=${shape.n})`;
    if (lanes > this.perRequest) throw new EbbError('invalid_request', `${asked}; this frontend serves at most ${this.perRequest} per request (--max-lanes-per-request)`, { param });
    const sockets = lanes * socketsPerLane;
    if (this.fds !== undefined) {
      // Its own connection is already counted; the rest of the budget is what it could ever have.
      if (sockets > this.fds - 1) throw new EbbError('invalid_request', `${asked}, ${sockets} worker sockets; this frontend's file-descriptor budget is ${this.fds} (raise ulimit -n)`, { param });
      if (this.connections + this.sockets + sockets > this.fds) {
        throw new EbbError(
          'frontend_overloaded',
          `this frontend is at its file-descriptor budget (${this.connections} client connections and ${this.sockets} worker sockets of ${this.fds}; ${asked}); retry shortly`,
        ); // no Retry-After: when streams end is not known here, and a guess would only synchronize retries
      }
    }
    this.sockets += sockets;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.sockets -= sockets;
    };
  }
}
