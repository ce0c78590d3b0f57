import type { FastifyRequest } from 'fastify';
import { resumeStream } from '../streams/resume-routes.js';
import type { StoredCompletion } from './completion-store.js';
import { ownIdOnly } from './id-routes.js';
import { listing, listPage, pageOf } from './list-query.js';
import { metadataSchema, type ChatMessageIn } from './openai-schema.js';
import type { RouteContext } from './route-context.js';

const PREFIX = 'chatcmpl-';

type IdRoute = { Params: { id: string }; Querystring: Record<string, string | string[] | undefined> };
type IdRequest = FastifyRequest<IdRoute>;

/** A stored message as OpenAI lists it: its id, and its content as text (its parts too, when it was sent as parts). */
function storeMessage(m: ChatMessageIn, id: string) {
  const parts = Array.isArray(m.content) ? m.content : null;
  const content = parts !== null ? parts.map((p) => p.text ?? '').join('') : (m.content ?? null);
  return {
    id,
    role: m.role,
    content,
    ...(m.name !== undefined && { name: m.name }),
    ...(m.tool_calls != null && { tool_calls: m.tool_calls }),
    ...(m.tool_call_id !== undefined && { tool_call_id: m.tool_call_id }),
    ...(m.function_call != null && { function_call: m.function_call }),
    content_parts: parts,
  };
}

const shown = (c: StoredCompletion) => c.completion;

/**
 * Stored chat completions (`store: true`), as OpenAI serves them: GET /v1/chat/completions/{id}
 * (with ?stream=true: its kept stream, resumed, as before), POST (its metadata), DELETE, its
 * /messages, and the list (GET /v1/chat/completions: model and metadata filters, pages). Each is
 * its tenant's; with --processes N a request naming one goes to the process that holds it.
 */
export function addStoredCompletionRoutes(ctx: RouteContext): void {
  const { app, completions, streams } = ctx;
  if (completions === undefined || streams === undefined) return;

  ctx.methods('/v1/chat/completions/:id', ['GET', 'POST', 'DELETE'], PREFIX);
  app.get('/v1/chat/completions/:id', async (req: IdRequest, reply) => {
    const id = req.params.id;
    const passed = ctx.toHolder(id, req, reply);
    if (passed !== undefined) return passed;
    const tenant = ctx.tenantOf(req);
    if (req.query.stream === 'true') return resumeStream(streams, id.startsWith(PREFIX) ? id : `not-${PREFIX}`, tenant, req.query.starting_after, req.headers['last-event-id'], reply.raw, () => reply.hijack());
    return shown(await completions.get(id, tenant));
  });
  app.post<{ Params: { id: string }; Body: { metadata: Record<string, string> | null } }>(
    '/v1/chat/completions/:id',
    { onRequest: ownIdOnly(PREFIX), schema: { body: { type: 'object', required: ['metadata'], properties: { metadata: metadataSchema } } } },
    async (req, reply) => {
      const passed = ctx.toHolder(req.params.id, req, reply, req.body);
      if (passed !== undefined) return passed;
      return shown(await completions.setMetadata(req.params.id, ctx.tenantOf(req), req.body.metadata ?? {}));
    },
  );
  app.delete<IdRoute>('/v1/chat/completions/:id', { onRequest: ownIdOnly(PREFIX) }, async (req, reply) => {
    const passed = ctx.toHolder(req.params.id, req, reply);
    if (passed !== undefined) return passed;
    await completions.delete(req.params.id, ctx.tenantOf(req));
    return { id: req.params.id, object: 'chat.completion.deleted', deleted: true };
  });

  ctx.methods('/v1/chat/completions/:id/messages', ['GET'], PREFIX);
  app.get<IdRoute>('/v1/chat/completions/:id/messages', { onRequest: ownIdOnly(PREFIX) }, async (req, reply) => {
    const passed = ctx.toHolder(req.params.id, req, reply);
    if (passed !== undefined) return passed;
    const q = listing(req.query, 'asc');
    const c = await completions.get(req.params.id, ctx.tenantOf(req));
    return pageOf(
      (c.messages as ChatMessageIn[]).map((m, i) => storeMessage(m, `${c.id}-${i}`)),
      q,
    );
  });

  // The list: POST /v1/chat/completions' methods name GET too where completions are stored (completions-route.ts).
  app.get('/v1/chat/completions', async (req: FastifyRequest<{ Querystring: Record<string, string | string[] | undefined> }>) => {
    const q = listing(req.query, 'asc');
    const model = req.query.model;
    const page = await completions.list(ctx.tenantOf(req), { ...q, model: typeof model === 'string' ? model : undefined });
    return listPage(page.data.map(shown), page.hasMore);
  });
}
