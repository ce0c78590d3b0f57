import { EbbError } from '../../protocol/errors.js';
import { toolsActive } from '../../protocol/tools.js';
import { counted } from '../limits/limiter.js';
import { reserveTokens } from '../limits/request-tokens.js';
import { headerValue } from '../relay/relay.js';
import { Shutdown } from '../shutdown.js';
import { detachedResponse } from '../streams/detached-response.js';
import { resumeStream } from '../streams/resume-routes.js';
import { callIds, parseToolCalls } from '../wire/tool-call-parser.js';
import { probeHalfClosedClient } from './client-gone.js';
import { RESPONSES_FIELD_POLICY } from './field-policy.js';
import { ownIdOnly } from './id-routes.js';
import { addInputTokensRoute } from './input-tokens-route.js';
import { listing, pageOf } from './list-query.js';
import { responsesSchema } from './openai-schema.js';
import type { ResponseRecord } from './response-store.js';
import { inputItems, ResponseShell, responseObject, responsesToGenerate, type ResponseProgress, type ResponsesRequest } from './responses-format.js';
import { responseWithCalls } from './responses-tools.js';
import type { RouteContext } from './route-context.js';
import { onServed } from './served-model.js';
import { ebbTier } from './service-tier.js';
import { streamFormat, type StreamPlan } from './stream-plan.js';

/**
 * The Responses API: POST /v1/responses (streamed, collected or background, a background one
 * streamed too), POST /v1/responses/input_tokens, and with kept responses GET /v1/responses/{id}
 * (the object, or its events after starting_after), its DELETE, its input_items and its cancel.
 */
export function addResponsesRoutes(ctx: RouteContext): void {
  const { app, responses, streams } = ctx;
  addInputTokensRoute(ctx);

  ctx.methods('/v1/responses', ['POST']);
  app.post<{ Body: ResponsesRequest }>('/v1/responses', { schema: { body: responsesSchema } }, async (req, reply) => {
    const body = req.body;
    const started = performance.now();
    const served = ctx.admit(body, RESPONSES_FIELD_POLICY);
    // The next turn of a response another process holds is served there, where its history is.
    const passed = typeof body.previous_response_id === 'string' ? ctx.toHolder(body.previous_response_id, req, reply, body) : undefined;
    if (passed !== undefined) return passed;
    const stateful = body.background === true ? 'background' : typeof body.previous_response_id === 'string' ? 'previous_response_id' : undefined;
    if (stateful !== undefined && responses === undefined) throw new EbbError('unsupported_parameter', `${stateful} needs kept responses: this server keeps none (a frontend run with --stream-store none, or a worker's --openai-port)`, { param: stateful });
    if (body.background === true && body.store === false) throw new EbbError('invalid_request', 'background responses are stored: store false is not allowed with background true', { param: 'store' });
    const tenant = ctx.tenantOf(req);
    const previous = typeof body.previous_response_id === 'string' ? await responses!.history(body.previous_response_id, tenant) : [];
    const shell = new ResponseShell(ctx.newId(), body);
    const { gen, history } = responsesToGenerate(body, shell.id, previous);
    onServed([gen], served);
    // Its tenant's limits, before it runs: a request that would cross one is refused here (429).
    const spend = await ctx.limit(req, reply, (limits) => reserveTokens([gen], 1, limits));
    const room = ctx.holdLanes(reply, served.model, 1, 1, spend);
    const signal = ctx.shutdown.requestSignal(reply.raw);
    shell.serviceTier = ctx.ticket([gen], ebbTier(body.service_tier), req, body.background === true ? undefined : signal, spend);
    const tools = toolsActive(gen.tools, gen.tool_choice) ? ctx.toolParsing(gen) : undefined;
    const record: ResponseRecord | undefined =
      responses === undefined ? undefined : { id: shell.id, tenant, background: body.background === true, store: body.store !== false, history, input: inputItems(body, shell.id), status: 'in_progress', endedAt: 0, bytes: 0 };
    if (record !== undefined) responses!.add(record);
    const plan: StreamPlan = {
      endpoint: 'responses',
      id: shell.id,
      gens: [gen],
      n: 1,
      model: body.model,
      includeUsage: false,
      created: shell.createdAt,
      serviceTier: shell.serviceTier,
      logprobs: false,
      tools,
      responses: { uuid: shell.id.slice('resp_'.length), request: body, messageId: shell.messageId, createdAt: shell.createdAt },
    };
    const formatted = (keep: boolean) => {
      const fmt = counted(streamFormat(plan, keep, shell), spend);
      if (record !== undefined) record.progress = fmt as ResponseProgress;
      return fmt;
    };
    const ended = record === undefined ? undefined : (_: unknown, reason: unknown) => responses!.settleStreamed(record, reason);
    if (body.background === true) {
      // Runs with no client: its events are kept (GET ?stream=true follows them), its object retrievable, cancel stops it.
      const detached = { raw: detachedResponse(), hijack: () => undefined };
      const fmt = formatted(true);
      const onKept = (kept: NonNullable<ResponseRecord['kept']>) => {
        record!.kept = kept;
        // Its first events at once (created and queued): a worker takes it when one can; a refusal then is its last event.
        kept.append(Buffer.from(fmt.announce!()));
      };
      const running = ctx.out.stream(detached, plan, fmt, new AbortController().signal, performance.now(), room, { keep: true, background: true, tenant, ended, onKept });
      running.catch((err: unknown) => ctx.log.warn({ event: 'background_response_failed', response_id: shell.id, err: (err as Error).message }, `background response ${shell.id} failed: ${(err as Error).message}`));
      // In a fleet, announced once the shared store has it: the client may ask another frontend next.
      await streams?.running(shell.id)?.lease?.opened;
      if (body.stream !== true) return shell.object('queued', undefined, undefined);
      // Streamed: its events from the first, followed as a resume follows them; the client leaving stops nothing.
      return resumeStream(streams!, shell.id, tenant, undefined, undefined, reply.raw, () => reply.hijack());
    }
    probeHalfClosedClient(req, reply);
    try {
      if (body.stream) {
        const keep = ctx.keeps(req);
        return await ctx.out.stream(reply, plan, formatted(keep), signal, started, room, { keep, tenant, ended, onKept: (kept) => record !== undefined && (record.kept = kept) });
      }
      const { choices, usage, workerId } = await ctx.relay.collect([gen], 1, signal, started);
      spend?.used(usage.total_tokens);
      void reply.header('x-ebb-worker-id', headerValue(workerId));
      const answer = tools !== undefined ? responseWithCalls(shell, choices[0]!, usage, parseToolCalls(choices[0]!.text, tools.syntax, callIds(tools.key, 0))) : responseObject(shell, choices[0]!, usage);
      // Stored before it is answered: the client's next call, at any frontend, finds it.
      if (record !== undefined) await responses!.settle(record, answer, answer.status);
      return answer;
    } catch (err) {
      if (record !== undefined && record.final === undefined) void responses!.settle(record, shell.object('failed', undefined, undefined), 'failed');
      throw Shutdown.cutReason(signal) ?? err;
    }
  });

  if (responses === undefined || streams === undefined) return;
  // The Responses API's own GET: the object (status, output so far), or with stream=true its events after starting_after.
  ctx.methods('/v1/responses/:id', ['GET', 'DELETE'], 'resp_');
  app.get<{ Params: { id: string }; Querystring: { stream?: string; starting_after?: string } }>('/v1/responses/:id', async (req, reply) => {
    const passed = ctx.toHolder(req.params.id, req, reply);
    if (passed !== undefined) return passed;
    const tenant = ctx.tenantOf(req);
    if (req.query.stream === 'true') return resumeStream(streams, req.params.id, tenant, req.query.starting_after, req.headers['last-event-id'], reply.raw, () => reply.hijack());
    return responses.object(req.params.id, tenant);
  });
  // Forgets a response that is over, everywhere the fleet kept it.
  app.delete<{ Params: { id: string } }>('/v1/responses/:id', { onRequest: ownIdOnly('resp_') }, async (req, reply) => {
    const passed = ctx.toHolder(req.params.id, req, reply);
    if (passed !== undefined) return passed;
    await responses.delete(req.params.id, ctx.tenantOf(req));
    return { id: req.params.id, object: 'response', deleted: true };
  });
  // Its input, as items (OpenAI's order: newest first unless asked).
  ctx.methods('/v1/responses/:id/input_items', ['GET'], 'resp_');
  app.get<{ Params: { id: string }; Querystring: Record<string, string | string[] | undefined> }>('/v1/responses/:id/input_items', { onRequest: ownIdOnly('resp_') }, async (req, reply) => {
    const passed = ctx.toHolder(req.params.id, req, reply);
    if (passed !== undefined) return passed;
    const q = listing(req.query, 'desc');
    return pageOf(await responses.input(req.params.id, ctx.tenantOf(req)), q);
  });
  // Stops a background response's generation on its worker at once (wherever it runs); the object says `cancelled`.
  ctx.methods('/v1/responses/:id/cancel', ['POST'], 'resp_');
  app.post<{ Params: { id: string } }>('/v1/responses/:id/cancel', async (req, reply) => {
    const passed = ctx.toHolder(req.params.id, req, reply, req.body ?? {});
    if (passed !== undefined) return passed;
    return responses.cancel(req.params.id, ctx.tenantOf(req));
  });
}
