import { toolsActive } from '../../protocol/tools.js';
import { counted } from '../limits/limiter.js';
import { reserveTokens } from '../limits/request-tokens.js';
import { headerValue } from '../relay/relay.js';
import { Shutdown } from '../shutdown.js';
import { parseToolCalls, callIds } from '../wire/tool-call-parser.js';
import { probeHalfClosedClient } from './client-gone.js';
import { FIELD_POLICY } from './field-policy.js';
import { completionResponse, toGenerateBodies, type Endpoint } from './openai-format.js';
import { chatCompletionSchema, completionSchema, type OpenAIRequest } from './openai-schema.js';
import type { RouteContext } from './route-context.js';
import { onServed } from './served-model.js';
import { streamFormat, type StreamPlan } from './stream-plan.js';
import { finishWithCalls } from './tool-stream.js';

/** POST /v1/chat/completions and /v1/completions: streamed (kept when its client will resume it) or collected. */
export function addCompletionRoutes(ctx: RouteContext): void {
  const route = (endpoint: Endpoint, url: string, schema: object) => {
    ctx.methods(url, ['POST']);
    ctx.app.post<{ Body: OpenAIRequest }>(url, { schema: { body: schema } }, async (req, reply) => {
      const body = req.body;
      const served = ctx.admit(body, FIELD_POLICY);
      const id = `${endpoint === 'chat' ? 'chatcmpl' : 'cmpl'}-${ctx.newId()}`;
      const gens = onServed(toGenerateBodies(endpoint, body, id), served);
      const n = body.n ?? 1;
      // Its tenant's limits, before it runs: a request that would cross one is refused here (429).
      const spend = await ctx.limit(req, reply, (limits) => reserveTokens(gens, n, limits));
      const room = ctx.holdLanes(reply, served.model, gens.length, n, spend);
      const signal = ctx.shutdown.requestSignal(reply.raw);
      const tier = ctx.ticket(gens, body.service_tier, req, signal, spend);
      probeHalfClosedClient(req, reply);
      const started = performance.now();
      // With tools: the answers' raw text is parsed into calls, in the syntax the model's workers declare.
      const tools = endpoint === 'chat' && toolsActive(gens[0]!.tools, gens[0]!.tool_choice) ? ctx.toolParsing(gens[0]!) : undefined;
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
          };
          const keep = ctx.keeps(req);
          return await ctx.out.stream(reply, plan, counted(streamFormat(plan, keep), spend), signal, started, room, { keep, tenant: ctx.tenantOf(req) });
        }
        const { choices, usage, workerId } = await ctx.relay.collect(gens, n, signal, started);
        spend?.used(usage.total_tokens);
        void reply.header('x-ebb-worker-id', headerValue(workerId));
        if (tools !== undefined)
          for (const [lane, c] of choices.entries()) {
            c.tools = parseToolCalls(c.text, tools.syntax, callIds(tools.key, lane));
            c.finishReason = finishWithCalls(c.finishReason, c.tools.calls.length);
          }
        return completionResponse(endpoint, id, body.model, choices, usage, tier);
      } catch (err) {
        throw Shutdown.cutReason(signal) ?? err;
      }
    });
  };
  route('chat', '/v1/chat/completions', chatCompletionSchema);
  route('completion', '/v1/completions', completionSchema);
}
