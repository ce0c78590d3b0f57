import type { FastifyReply, FastifyRequest } from 'fastify';

/** An empty informational answer: HTTP/1.1 clients skip any 1xx before the response (RFC 9110 15.2). */
const PROBE = Buffer.from('HTTP/1.1 103 Early Hints\r\n\r\n', 'latin1');
/** How often a half-closed client is probed until its response starts: how late a leaver is noticed. */
const PROBE_EVERY_MS = 250;

/**
 * Makes a client that left before its response started be noticed, so its request's signal (which
 * aborts when the response closes unfinished) frees its work.
 *
 * The public listener keeps half-open connections (a client like `nc -N` shuts its write side and
 * waits for its answer), so a client's FIN does not say it left, and before the first byte nothing
 * is written that would find out: its request would stay queued on a worker, its lanes generating.
 * So a client that half-closed before its response started is sent an empty 1xx now and then: one
 * that waits skips it; a closed socket answers it with a reset, the next write fails, the socket
 * closes (the response's `close`) and the work is freed. There is no event for a peer's full close
 * to wait on instead.
 */
export function probeHalfClosedClient(req: FastifyRequest, reply: FastifyReply): void {
  // HTTP/1.0 clients need not skip a 1xx; they are left as they were.
  if (req.raw.httpVersionMajor !== 1 || req.raw.httpVersionMinor < 1) return;
  const res = reply.raw;
  const socket = req.raw.socket;
  let timer: NodeJS.Timeout | undefined;
  const probe = () => {
    if (res.headersSent || socket.destroyed || !socket.writable) return stop();
    // Only while this is the socket's current response: a pipelined one behind another waits its turn.
    if (res.socket === socket) socket.write(PROBE);
    timer ??= setInterval(probe, PROBE_EVERY_MS).unref();
  };
  const stop = () => {
    socket.off('end', probe);
    if (timer !== undefined) clearInterval(timer);
  };
  res.once('close', stop);
  if (socket.readableEnded) probe();
  else socket.once('end', probe);
}
