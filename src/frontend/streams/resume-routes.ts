import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { ServerResponse } from 'node:http';
import { EbbError } from '../../protocol/errors.js';
import type { ResumeFrom } from './kept-stream.js';
import type { StreamStore } from './stream-store.js';
import { traceResume } from '../../tracing/frontend-spans.js';
import { requestContext } from '../../tracing/request-trace.js';

/** What a resumed stream's response carries, as the original did. */
export const SSE_HEADERS: Record<string, string> = { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'x-ebb-resumable': '1' };

/** `starting_after` (the API's) or `Last-Event-ID` (EventSource's): the last event the client has. */
export function resumePoint(startingAfter: unknown, lastEventId: unknown): ResumeFrom {
  const raw = startingAfter ?? lastEventId;
  if (raw === undefined || raw === '') return undefined;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < -1) throw new EbbError('invalid_request', `starting_after (or Last-Event-ID) must be an event id, an integer >= -1: got ${JSON.stringify(raw)}`, { param: 'starting_after' });
  return n;
}

export interface ResumeDeps {
  store: StreamStore;
  /** With --processes N: passes the request to the process that holds `id`, when another one does (undefined: served here). */
  toHolder?: ((id: string, req: FastifyRequest, reply: FastifyReply) => Promise<void> | undefined) | undefined;
  methods(url: string, allowed: Array<'GET' | 'POST'>, idPrefix?: string): void;
  /** Who asks (the API key's name; '' without keys): another tenant's stream is one never heard of. */
  tenantOf(req: FastifyRequest): string;
}

/**
 * GET /v1/completions/{id}?stream=true: the kept stream from after `starting_after` (or
 * Last-Event-ID), byte for byte as the original connection got it, then its live rest and its one
 * end. Chat's (api/stored-completions-routes.ts) and the Responses API's (api/responses-routes.ts)
 * GETs are their own: they also retrieve what is stored.
 */
export function addResumeRoutes(app: FastifyInstance, deps: ResumeDeps): void {
  for (const [url, prefix] of [['/v1/completions/:id', 'cmpl-']] as const) {
    deps.methods(url, ['GET'], prefix);
    app.get<{ Params: { id: string }; Querystring: { stream?: string; starting_after?: string } }>(url, async (req, reply) => {
      if (req.query.stream !== 'true')
        throw new EbbError('invalid_request', 'ebb keeps completions\' streams to resume them, not completions to retrieve (chat completions are stored with store: true): add ?stream=true (and starting_after)', { param: 'stream' });
      const passed = deps.toHolder?.(req.params.id, req, reply);
      if (passed !== undefined) return passed;
      return resumeStream(deps.store, req.params.id.startsWith(prefix) ? req.params.id : `not-${prefix}`, deps.tenantOf(req), req.query.starting_after, req.headers['last-event-id'], reply.raw, () => reply.hijack());
    });
  }
}

/** Follows kept stream `id` on `res` from the client's resume point; throws the 404 (or 400) when it cannot. */
export function resumeStream(store: StreamStore, id: string, tenant: string, startingAfter: unknown, lastEventId: unknown, res: ServerResponse, hijack: () => void): Promise<void> {
  traceResume(requestContext(res), res, id, startingAfter ?? lastEventId);
  return store.resume(id, tenant, res, resumePoint(startingAfter, lastEventId), SSE_HEADERS, hijack);
}
