import { toolsActive } from '../../protocol/tools.js';
import { counted } from '../limits/limiter.js';
import { reserveTokens } from '../limits/request-tokens.js';
import { headerValue } from '../relay/relay.js';
import { Shutdown } from '../shutdown.js';
import { parseToolCalls, callIds } from '../wire/tool-call-parser.js';
import { probeHalfClosedClient } from './client-gone.js';
import { FIELD_POLICY } from './field-policy.js';
import { EbbError } from '../../protocol/errors.js';
import type { StoredCompletion } from './completion-store.js';
import { completionResponse, toGenerateBodies, usesFunctions, type Endpoint } from './openai-format.js';
import { chatCompletionSchema, completionSchema, type OpenAIRequest } from './openai-schema.js';
import type { RouteContext } from './route-context.js';
import { onServed } from './served-model.js';
import { ebbTier } from './service-tier.js';
import { completionFromChunks, StoredStream } from './stored-stream.js';
import type { KeptStream } from '../streams/kept-stream.js';
import type { Ended } from './stream-out.js';
import { streamFormat, type StreamPlan } from './stream-plan.js';
import { finishWithCalls } from './tool-stream.js';

/** POST /v1/chat/completions and /v1/completions: streamed (kept when its client will resume it) or collected; chat's stored with store: true. */
export function addCompletionRoutes(ctx: RouteContext): void {
  const route = (endpoint: Endpoint, url: string, schema: object) => {
    // Where chat completions are stored, GET lists them (stored-completions-routes.ts).
    ctx.methods(url, endpoint === 'chat' && ctx.completions !== undefined ? ['GET', 'POST'] : ['POST']);
    ctx.app.post<{ Body: OpenAIRequest }>(url, { schema: { body: schema } }, async (req, reply) => {
      const body = req.body;
      const served = ctx.admit(body, FIELD_POLICY);
      if (endpoint === 'completion' && body.store === true) throw new EbbError('unsupported_parameter', 'store is not supported on /v1/completions: OpenAI stores chat completions (use /v1/chat/completions)', { param: 'store' });
      const store = body.store === true ? ctx.completions : undefined;
      if (body.store === true && store === undefined) throw new EbbError('unsupported_parameter', 'store needs kept responses: this server keeps none (a frontend run with --stream-store none, or a worker\'s --openai-port)', { param: 'store' });
      const id = `${endpoint === 'chat' ? 'chatcmpl' : 'cmpl'}-${ctx.newId()}`;
      const gens = onServed(toGenerateBodies(endpoint, body, id), served);
      const n = body.n ?? 1;
      // Its tenant's limits, before it runs: a request that would cross one is refused here (429).
      const spend = await ctx.limit(req, reply, (limits) => reserveTokens(gens, n, limits));
      const room = ctx.holdLanes(reply, served.model, gens.length, n, spend);
      const signal = ctx.shutdown.requestSignal(reply.raw);
      const tier = ctx.ticket(gens, ebbTier(body.service_tier), req, signal, spend);
      probeHalfClosedClient(req, reply);
      const started = performance.now();
      // With tools: the answers' raw text is parsed into calls, in the syntax the model's workers declare.
      const legacy = endpoint === 'chat' && usesFunctions(body);
      const tools = endpoint === 'chat' && toolsActive(gens[0]!.tools, gens[0]!.tool_choice) ? { ...ctx.toolParsing(gens[0]!), ...(legacy && { legacy }) } : undefined;
      const tenant = ctx.tenantOf(req);
      const stored = (completion: Record<string, unknown>): StoredCompletion => ({ id, tenant, completion: { ...completion, id, model: body.model, metadata: body.metadata ?? {} }, messages: body.messages ?? [], at: Date.now() });
      try {
        if (body.stream) {
          const plan: StreamPlan = {
            endpoint,
            id,
            gens,
            n,
            model: body.model,
            includeUsage: body.stream_options?.include_usage === true,
            created: Math.floor(Date.now() / 1000),
            serviceTier: tier,
            logprobs: gens[0]!.logprobs === true,
            tools,
            ...(store !== undefined && { stored: { metadata: body.metadata ?? {}, messages: body.messages ?? [] } }),
          };
          const keep = ctx.keeps(req);
          // Its usage settles its tenant's reservation as its end is written.
          const format = counted(streamFormat(plan, keep), spend);
          if (store === undefined) return await ctx.out.stream(reply, plan, format, signal, started, room, { keep, tenant });
          // Stored as its end is written: the completion its events make.
          const fmt = new StoredStream(format);
          const ended = () => {
            const completion = fmt.completion();
            if (completion !== undefined) void keepCompletion(ctx, store, stored(completion));
          };
          return await ctx.out.stream(reply, plan, fmt, signal, started, room, { keep, tenant, ended });
        }
        const { choices, usage, workerId } = await ctx.relay.collect(gens, n, signal, started);
        spend?.used(usage.total_tokens);
        void reply.header('x-ebb-worker-id', headerValue(workerId));
        if (tools !== undefined)
          for (const [lane, c] of choices.entries()) {
            c.tools = parseToolCalls(c.text, tools.syntax, callIds(tools.key, lane));
            c.finishReason = finishWithCalls(c.finishReason, c.tools.calls.length);
          }
        const answer = completionResponse(endpoint, id, body.model, choices, usage, tier, legacy);
        // Stored before it is answered: the client's next call, at any frontend, finds it.
        if (store !== undefined) await keepCompletion(ctx, store, stored(answer));
        return answer;
      } catch (err) {
        throw Shutdown.cutReason(signal) ?? err;
      }
    });
  };
  route('chat', '/v1/chat/completions', chatCompletionSchema);
  route('completion', '/v1/completions', completionSchema);
}

/**
 * A kept chat stream to be stored (store: true) that this frontend took over from one that died:
 * stored as it ends here, the completion read from its kept events (those the first frontend sent,
 * then this one's). Undefined for any other stream.
 */
export function storedWhenTakenOver(ctx: Pick<RouteContext, 'completions' | 'log'>, plan: StreamPlan, kept: KeptStream): Ended | undefined {
  const store = ctx.completions;
  const wanted = plan.stored;
  if (store === undefined || wanted === undefined || plan.endpoint !== 'chat') return undefined;
  return () => {
    if (kept.current !== 'ended') return;
    // Past its byte bound its events are no longer all kept: what is left would store a part of it as the whole.
    if (!kept.resumable) {
      ctx.log.warn({ event: 'chat_completion_not_stored', response_id: plan.id, err: 'its stream outgrew --stream-store-max-bytes' }, `chat completion ${plan.id} was answered but not stored: its stream outgrew --stream-store-max-bytes`);
      return;
    }
    const completion = completionFromChunks(kept.whole().toString('utf8'));
    if (completion !== undefined)
      void keepCompletion(ctx, store, { id: plan.id, tenant: kept.tenant, completion: { ...completion, id: plan.id, model: plan.model, metadata: wanted.metadata }, messages: wanted.messages, at: Date.now() });
  };
}

/** Stores a completion; a store that cannot take it (Redis away) costs the client nothing of its answer: said in the log. */
async function keepCompletion(ctx: Pick<RouteContext, 'log'>, store: NonNullable<RouteContext['completions']>, c: StoredCompletion): Promise<void> {
  try {
    await store.put(c);
  } catch (err) {
    ctx.log.warn({ event: 'chat_completion_not_stored', response_id: c.id, err: (err as Error).message }, `chat completion ${c.id} was answered but not stored: ${(err as Error).message}`);
  }
}
