import type { FastifyReply, FastifyRequest } from 'fastify';
import { errorBody } from '../../protocol/errors.js';

/** Whether a request's `:id` is of the kind its route serves (resp_, chatcmpl-). */
export function isOwnId(req: FastifyRequest, prefix: string): boolean {
  return (req.params as { id?: string }).id?.startsWith(prefix) === true;
}

/**
 * A route's hook: a path whose `:id` is not of the route's kind (POST /v1/responses/compact) is
 * unknown, answered the 404 any unknown path gets, not a 400 about its body nor a 405.
 */
export function ownIdOnly(prefix: string) {
  return async (req: FastifyRequest, reply: FastifyReply): Promise<void> => {
    if (!isOwnId(req, prefix)) await reply.code(404).send(errorBody('not_found', `no route for ${req.method} ${req.url}`));
  };
}
