import Fastify, { type FastifyInstance, type FastifyError, type FastifyReply, type FastifyRequest } from 'fastify';
import { readFileSync } from 'node:fs';
import type { AddressInfo, Socket } from 'node:net';
import { hostname } from 'node:os';
import { EbbError, errorBody, type ErrorCode } from '../protocol/errors.js';
import { schemaError, type SchemaViolation } from './schema-errors.js';
import { PROBE_PATHS } from './admin-boundary.js';
import { applyConnectionBudget, type StreamBudget } from './connection-budget.js';
import { lazySerializers, lazyValidators, SERVER_AJV_CUSTOM } from './lazy-schema-compilers.js';

/** The probes each kind of listener serves (a worker's system server: /live, /health and /ready; the frontend's OpenAI port: /health). */
const DEFAULT_PROBES: Record<ListenerRole, readonly string[]> = { admin: PROBE_PATHS, public: ['/health'], internal: [] };

/** Fits the longest worker id percent-encoded (253 bytes, 3 characters each) with room to spare. */
const MAX_PARAM_LENGTH = 1024;

const ALL_METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS'] as const;

/**
 * What a listener is for, which sets its connection budget: `public` (the OpenAI port) and
 * `internal` (a worker's request plane) share most of the process's file descriptors; `admin`
 * listeners (frontend admin, worker system server) get a small budget of their own, so a flood on
 * the public port can never starve the operator's drain button.
 */
export type ListenerRole = 'public' | 'internal' | 'admin';

export interface HttpServerLimits {
  /** Whole request, headers and body, must arrive within this (ms); 408 request_timeout otherwise. */
  requestTimeoutMs?: number | undefined;
  /** Headers must arrive within this (ms) of the connection (or of the previous response); capped at requestTimeoutMs. */
  headersTimeoutMs?: number | undefined;
  /** An idle keep-alive connection is closed after this (ms). */
  keepAliveTimeoutMs?: number | undefined;
  /**
   * A socket with no traffic either way for this long (ms) is destroyed; 0 = off. Off by default on
   * public and internal listeners: a stream can be legitimately silent while a worker queues it, and
   * headersTimeoutMs already bounds a connection that never sends its first bytes.
   */
  connectionTimeoutMs?: number | undefined;
  /**
   * Open connections the listener serves any request on; past it, a new connection evicts an idle or
   * slow one, or may only ask for a probe (see connection-budget).
   */
  maxConnections?: number | undefined;
}

export interface HttpServerOptions extends HttpServerLimits {
  /** Sets the default limits; 'internal' when not given. */
  role?: ListenerRole | undefined;
  /** Paths (GET) answered even when every connection is busy; default by role (admin: /live, /health, /ready; public: /health). */
  probePaths?: readonly string[] | undefined;
  /** Event streams (GET paths) served from a connection budget of their own (see connection-budget). */
  eventStreams?: StreamBudget | undefined;
  bodyLimit?: number | undefined;
  emptyJsonIsObject?: boolean | undefined;
  /**
   * A client that sends its request and then shuts its write side (nc -N, some proxies) still gets
   * its answer; node's default aborts the request on the half-close. The cost: a client that closed
   * for good is only noticed at the next write. Default: on for `public` listeners only, so an
   * internal caller that gives up (the frontend aborting a /generate) is seen at once.
   */
  allowHalfOpen?: boolean | undefined;
}

/** The process's open-file limit (Linux /proc), or undefined where it cannot be read. */
export function fdLimit(): number | undefined {
  try {
    const line = readFileSync('/proc/self/limits', 'utf8')
      .split('\n')
      .find((l) => l.startsWith('Max open files'));
    const soft = Number(line?.split(/\s{2,}/)[1]);
    return Number.isFinite(soft) && soft > 0 ? soft : undefined;
  } catch {
    return undefined;
  }
}

/** Admin listeners: operators and fleet tools, a few at a time. */
export const ADMIN_MAX_CONNECTIONS = 64;

/**
 * Connections a public or internal listener may hold: under half of what the fd limit leaves after
 * a reserve (admin listener, discovery, logs), because every proxied request also holds a socket to
 * its worker.
 */
export function defaultMaxConnections(role: ListenerRole, limit = fdLimit() ?? 1024): number {
  if (role === 'admin') return ADMIN_MAX_CONNECTIONS;
  return Math.max(16, Math.floor((limit - ADMIN_MAX_CONNECTIONS - 128) / 2));
}

export function defaultLimits(role: ListenerRole): Required<HttpServerLimits> {
  return {
    requestTimeoutMs: 30_000,
    headersTimeoutMs: 10_000,
    // Internal callers (the frontend's pool) keep sockets warm between requests; public clients get 5 s.
    keepAliveTimeoutMs: role === 'internal' ? 65_000 : 5_000,
    connectionTimeoutMs: role === 'admin' ? 60_000 : 0,
    maxConnections: defaultMaxConnections(role),
  };
}

const CLIENT_ERRORS: Record<string, { status: number; code: ErrorCode; message: string }> = {
  ERR_HTTP_REQUEST_TIMEOUT: { status: 408, code: 'request_timeout', message: 'the request did not arrive in time' },
  HPE_HEADER_OVERFLOW: { status: 431, code: 'header_fields_too_large', message: 'the request headers are too large' },
};

/** How long a connection answered with a parser-level error may take to read that answer before it is closed. */
const CLIENT_ERROR_LINGER_MS = 5_000;

/**
 * Parser-level failures (garbage, smuggling attempts, oversized headers, timeouts) answered in ebb's
 * JSON error shape, then the connection is closed: after a parse error nothing else on it can be
 * trusted. A response already under way cannot be replaced: that socket is just closed.
 */
export function answerClientError(err: NodeJS.ErrnoException, socket: Socket): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  const inProgress = (socket as Socket & { _httpMessage?: { headersSent?: boolean } })._httpMessage;
  if (!socket.writable || inProgress?.headersSent) {
    socket.destroy();
    return;
  }
  const known = (err.code && CLIENT_ERRORS[err.code]) || { status: 400, code: 'invalid_request' as const, message: 'the request could not be parsed as HTTP/1.1' };
  const body = JSON.stringify(errorBody(known.code, known.message));
  socket.end(
    `HTTP/1.1 ${known.status} ${known.status === 408 ? 'Request Timeout' : known.status === 431 ? 'Request Header Fields Too Large' : 'Bad Request'}\r\n` +
      `content-type: application/json; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
  );
  // A deadline, not an idle timeout: a peer that never reads but keeps dripping bytes (a slowloris
  // past its headers timeout) reset the idle timer with every byte and held its socket for good.
  const linger = setTimeout(() => socket.destroy(), CLIENT_ERROR_LINGER_MS).unref();
  socket.once('close', () => clearTimeout(linger));
}

/**
 * A fastify instance whose every failure answers JSON: 404 for unknown paths, 400 for bad bodies,
 * the EbbError's own status otherwise, and parser-level errors too. Every connection is bounded
 * (see HttpServerLimits; defaults by `role`). Fastify's logger stays off: request logging on a hot
 * path costs more than it tells; ebb logs lifecycle events itself.
 */
export function createHttpServer(opts: HttpServerOptions = {}): FastifyInstance {
  const role = opts.role ?? 'internal';
  const d = defaultLimits(role);
  const requestTimeout = opts.requestTimeoutMs ?? d.requestTimeoutMs;
  const headersTimeout = Math.min(opts.headersTimeoutMs ?? d.headersTimeoutMs, requestTimeout > 0 ? requestTimeout : Infinity);
  // Node checks the two timeouts on this interval (30 s by default): short timeouts need a short one.
  const checkEvery = Math.max(50, Math.min(30_000, Math.floor(Math.min(headersTimeout, requestTimeout || Infinity) / 4)));
  // return503OnClosing off: while closing, requests on open keep-alive connections get our own answers
  // (a worker's JSON worker_draining refusal), not fastify's non-JSON 503.
  const app = Fastify({
    logger: false,
    bodyLimit: opts.bodyLimit ?? 4 * 1024 * 1024,
    keepAliveTimeout: opts.keepAliveTimeoutMs ?? d.keepAliveTimeoutMs,
    requestTimeout,
    connectionTimeout: opts.connectionTimeoutMs ?? d.connectionTimeoutMs,
    http: { headersTimeout, requestTimeout, connectionsCheckingInterval: checkEvery },
    clientErrorHandler: answerClientError,
    return503OnClosing: false,
    // A path parameter (a worker id, up to 253 bytes, percent-encoded) fits; past it, JSON 400 (frameworkErrors).
    routerOptions: { maxParamLength: MAX_PARAM_LENGTH },
    frameworkErrors: (err, _req, reply) => {
      void (reply as FastifyReply).code(400).send(errorBody('invalid_request', err.message));
    },
    // JSON bodies are typed: "stream": "true" is a client bug to report, not a value to guess.
    ajv: { customOptions: { ...SERVER_AJV_CUSTOM } },
    schemaController: { compilersFactory: { buildValidator: lazyValidators, buildSerializer: lazySerializers } },
  });
  applyConnectionBudget(app.server, opts.maxConnections ?? d.maxConnections, opts.probePaths ?? DEFAULT_PROBES[role], opts.eventStreams);
  (app.server as { httpAllowHalfOpen?: boolean }).httpAllowHalfOpen = opts.allowHalfOpen ?? role === 'public';
  if (opts.emptyJsonIsObject) {
    // Admin APIs: a POST with no body (plain `curl -X POST`), or a JSON content type with an empty
    // body, is a plain call: its body validates as {}.
    app.addHook('preValidation', async (req) => {
      req.body ??= {};
    });
    app.removeContentTypeParser('application/json');
    app.addContentTypeParser('application/json', { parseAs: 'string' }, (_req, body, done) => {
      const text = (body as string).trim();
      if (text === '') return done(null, {});
      try {
        done(null, JSON.parse(text));
      } catch (err) {
        (err as { statusCode?: number }).statusCode = 400;
        done(err as Error);
      }
    });
  }
  app.setNotFoundHandler((req, reply) => {
    void reply.code(404).send(errorBody('not_found', `no route for ${req.method} ${req.url}`));
  });
  app.setErrorHandler((err: FastifyError | EbbError, req, reply) => {
    if (err instanceof EbbError) {
      if (err.headers) void reply.headers(err.headers);
      return reply.code(err.status).send(err.body());
    }
    // A body that fails its schema: the field at fault and OpenAI's code and wording (schema-errors.ts).
    if (err.validation !== undefined) {
      const failed = schemaError(err.validation as unknown as SchemaViolation[], validated(req, err.validationContext), req.routeOptions.schema?.[(err.validationContext ?? 'body') as 'body']);
      return reply.code(400).send(failed.body());
    }
    const status = err.statusCode && err.statusCode >= 400 && err.statusCode < 600 ? err.statusCode : 500;
    // A body over the limit is answered before it is read: fastify's `connection: close` closed the
    // socket on the unread rest, and the kernel's reset reached the client before the 413 did. Kept
    // alive, Node reads the rest and drops it (within the request timeout), and the client gets its 413.
    if (status === 413) reply.removeHeader('connection');
    const code: ErrorCode =
      status === 400 ? 'invalid_request' : status === 415 ? 'unsupported_media_type' : status === 413 ? 'payload_too_large' : status === 408 ? 'request_timeout' : 'internal_error';
    // A body that is not JSON: said as OpenAI says it, with the parser's reason.
    const message = err.code === 'FST_ERR_CTP_INVALID_JSON_BODY' || err instanceof SyntaxError ? `We could not parse the JSON body of your request: ${err.message}` : err.message;
    return reply.code(status).send(errorBody(code, message));
  });
  return app;
}
/** The part of a request its schema validated (the body, unless the error says the query or params). */
function validated(req: FastifyRequest, context: string | undefined): unknown {
  return context === 'querystring' ? req.query : context === 'params' ? req.params : context === 'headers' ? req.headers : req.body;
}

/**
 * Registers `methods` on `url` and a JSON 405 with an Allow header for every other method. `owns`:
 * whether a request's path is one of this route's at all (a parametric route's id of the right
 * kind); a path it does not own is the 404 any unknown path gets.
 */
export function allowOnly(app: FastifyInstance, url: string, methods: readonly (typeof ALL_METHODS)[number][], owns?: (req: FastifyRequest) => boolean): void {
  const others = ALL_METHODS.filter((m) => !methods.includes(m) && !(m === 'HEAD' && methods.includes('GET')));
  const allow = methods.join(', ');
  app.route({
    method: [...others],
    url,
    handler: (req, reply) =>
      owns !== undefined && !owns(req)
        ? reply.code(404).send(errorBody('not_found', `no route for ${req.method} ${req.url}`))
        : reply.code(405).header('allow', allow).send(errorBody('method_not_allowed', `${req.method} is not allowed on ${url}; use ${allow}`)),
  });
}

/**
 * The URL peers should use for a listener: `advertiseHost` when given; the bound address unless it
 * is a wildcard (0.0.0.0, ::), which nobody can connect to, in which case this machine's hostname.
 */
export function advertisedUrl(boundUrl: string, advertiseHost?: string): string {
  const url = new URL(boundUrl);
  const wildcard = url.hostname === '0.0.0.0' || url.hostname === '[::]';
  if (advertiseHost === undefined && !wildcard) return boundUrl;
  url.hostname = advertiseHost ?? hostname();
  return url.origin;
}

/** Node's own listen backlog, used where the kernel's limit cannot be read. */
const NODE_DEFAULT_BACKLOG = 511;

/**
 * The accept queue a listener asks for: the kernel's maximum (net.core.somaxconn). With Node's 511,
 * a burst of a few thousand connections (clients reconnecting after a rollout, a frontend opening
 * one upstream socket per stream) overflows the queue; the kernel drops the SYNs and the clients
 * retry 1 s, 3 s, 7 s later, so first tokens arrive in waves while the process sits idle.
 * Raising net.core.somaxconn raises this.
 */
export function listenBacklog(): number {
  try {
    const n = Number(readFileSync('/proc/sys/net/core/somaxconn', 'utf8').trim());
    return Number.isSafeInteger(n) && n > 0 ? n : NODE_DEFAULT_BACKLOG;
  } catch {
    return NODE_DEFAULT_BACKLOG;
  }
}

export async function listen(app: FastifyInstance, host: string, port: number): Promise<string> {
  await app.listen({ host, port, backlog: listenBacklog() });
  const addr = app.server.address() as AddressInfo;
  const h = addr.family === 'IPv6' ? `[${addr.address}]` : addr.address;
  return `http://${h}:${addr.port}`;
}
