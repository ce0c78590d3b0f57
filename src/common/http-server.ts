import Fastify, { type FastifyInstance, type FastifyError } from 'fastify';
import type { AddressInfo } from 'node:net';
import { hostname } from 'node:os';
import { EbbError, errorBody, type ErrorCode } from '../protocol/errors.js';

const ALL_METHODS = ['GET', 'HEAD', 'POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS'] as const;

/**
 * A fastify instance whose every failure answers JSON: 404 for unknown paths, 400 for bad bodies,
 * the EbbError's own status otherwise. Fastify's logger stays off: request logging on a hot path
 * costs more than it tells; ebb logs lifecycle events itself.
 */
export function createHttpServer(opts: { bodyLimit?: number; keepAliveTimeout?: number; emptyJsonIsObject?: boolean } = {}): FastifyInstance {
  // return503OnClosing off: while closing, requests on open keep-alive connections get our own answers
  // (a worker's JSON worker_draining refusal), not fastify's non-JSON 503.
  const app = Fastify({
    logger: false,
    bodyLimit: opts.bodyLimit ?? 4 * 1024 * 1024,
    keepAliveTimeout: opts.keepAliveTimeout ?? 65_000,
    return503OnClosing: false,
    // JSON bodies are typed: "stream": "true" is a client bug to report, not a value to guess.
    ajv: { customOptions: { coerceTypes: false, removeAdditional: false } },
  });
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
  app.setErrorHandler((err: FastifyError | EbbError, _req, reply) => {
    if (err instanceof EbbError) {
      if (err.headers) void reply.headers(err.headers);
      return reply.code(err.status).send(err.body());
    }
    const status = err.statusCode && err.statusCode >= 400 && err.statusCode < 600 ? err.statusCode : 500;
    const code: ErrorCode = status === 400 ? 'invalid_request' : status === 415 ? 'unsupported_media_type' : status === 413 ? 'payload_too_large' : 'internal_error';
    return reply.code(status).send(errorBody(code, err.message));
  });
  return app;
}

/** Registers `methods` on `url` and a JSON 405 with an Allow header for every other method. */
export function allowOnly(app: FastifyInstance, url: string, methods: readonly (typeof ALL_METHODS)[number][]): void {
  const others = ALL_METHODS.filter((m) => !methods.includes(m) && !(m === 'HEAD' && methods.includes('GET')));
  const allow = methods.join(', ');
  app.route({
    method: [...others],
    url,
    handler: (req, reply) =>
      reply.code(405).header('allow', allow).send(errorBody('method_not_allowed', `${req.method} is not allowed on ${url}; use ${allow}`)),
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

export async function listen(app: FastifyInstance, host: string, port: number): Promise<string> {
  await app.listen({ host, port });
  const addr = app.server.address() as AddressInfo;
  const h = addr.family === 'IPv6' ? `[${addr.address}]` : addr.address;
  return `http://${h}:${addr.port}`;
}
