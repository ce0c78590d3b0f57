import { EbbError } from '../../protocol/errors.js';
import type { GenerateBody } from '../../protocol/request-plane.js';
import { noServingWorker } from '../relay/worker-answer.js';
import { INPUT_TOKENS_FIELD_POLICY } from './field-policy.js';
import { responsesSchema } from './openai-schema.js';
import { responsesToGenerate, type ResponsesRequest } from './responses-format.js';
import type { RouteContext } from './route-context.js';
import { onServed } from './served-model.js';

/** The Responses request's own schema, its input optional (instructions alone may be counted). */
const inputTokensSchema = { ...responsesSchema, required: ['model'] } as const;

/**
 * POST /v1/responses/input_tokens: how many tokens a Responses request's input would be to its
 * model, counted by a worker of it (POST /tokenize on its request plane: its engine's tokenizer,
 * the conversation rendered by its chat template; previous_response_id's conversation first). A
 * model none of whose engines tokenizes is a 400 naming model; none reachable now, a 503.
 */
export function addInputTokensRoute(ctx: RouteContext): void {
  ctx.methods('/v1/responses/input_tokens', ['POST']);
  ctx.app.post<{ Body: ResponsesRequest }>('/v1/responses/input_tokens', { schema: { body: inputTokensSchema } }, async (req, reply) => {
    const body = req.body;
    const served = ctx.admit(body, INPUT_TOKENS_FIELD_POLICY);
    const previousId = typeof body.previous_response_id === 'string' ? body.previous_response_id : undefined;
    const passed = previousId === undefined ? undefined : ctx.toHolder(previousId, req, reply, body);
    if (passed !== undefined) return passed;
    if (previousId !== undefined && ctx.responses === undefined) throw new EbbError('unsupported_parameter', 'previous_response_id needs kept responses: this server keeps none', { param: 'previous_response_id' });
    const previous = previousId === undefined ? [] : await ctx.responses!.history(previousId, ctx.tenantOf(req));
    const { gen } = responsesToGenerate({ ...body, input: body.input ?? [] }, 'input_tokens', previous, true);
    onServed([gen], served);
    return { object: 'response.input_tokens', input_tokens: await count(ctx, gen) };
  });
}

/** Asks the model's workers in turn until one counts. */
async function count(ctx: RouteContext, gen: GenerateBody): Promise<number> {
  const { pool } = ctx;
  const mode = pool.servingPath(gen.model) === 'aggregated' ? 'aggregated' : 'decode';
  const tried = new Set<string>();
  let cannot = 0;
  for (let w = pool.pick(gen.model, mode, tried, [], undefined, gen.adapter); w !== undefined; w = pool.pick(gen.model, mode, tried, [], undefined, gen.adapter)) {
    tried.add(w.record.worker_id);
    const answer = await ctx.tokenize?.(w.record, gen).catch(() => undefined);
    if (answer !== undefined && 'ids' in answer) return answer.ids.length;
    if (answer?.refused === 404) cannot++;
  }
  if (tried.size > 0 && cannot === tried.size) {
    const engines = pool.engineKinds(gen.model).join(', ') || 'unknown';
    throw new EbbError('unsupported_parameter', `no worker of model "${gen.model}" can count tokens: its engines (${engines}) have no tokenizer ebb can ask`, { param: 'model' });
  }
  throw noServingWorker(`no worker of "${gen.model}" could count the tokens right now; retry shortly`);
}
