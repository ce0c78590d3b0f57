import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { allowOnly } from '../common/http-server.js';
import type { Engine } from '../engine/engine.js';
import type { Admission, RefusalCode } from '../lifecycle/admission.js';
import { EbbError } from '../protocol/errors.js';
import { GenerateBodySchema, promptOf, type GenerateBody, type TokenizeResponse } from '../protocol/request-plane.js';
import { refusal } from './request-gate.js';

/** POST /tokenize calls in progress at once, their bodies included; past it 503 worker_overloaded. */
export const MAX_TOKENIZING = 8;

/**
 * POST /tokenize: a prompt's token ids, for the frontend's kv router. Tokenizing admits no
 * generation, but is admitted like one: refused once admission is closed (draining, drained: the
 * router then routes by load alone) and bounded in concurrency, checked before the body is read
 * (20 calls of 3.5 MB at once took a worker from 173 to 471 MB).
 */
export function addTokenizeRoute(app: FastifyInstance, model: string, engine: Engine, admission: Admission): void {
  let tokenizing = 0;
  allowOnly(app, '/tokenize', ['POST']);
  const admitTokenize = async (_req: FastifyRequest, reply: FastifyReply) => {
    const refused: RefusalCode | undefined = !admission.open ? 'worker_draining' : tokenizing >= MAX_TOKENIZING ? 'worker_overloaded' : undefined;
    if (refused !== undefined) return reply.code(503).header('retry-after', '1').send(refusal(refused));
    tokenizing++;
    reply.raw.once('close', () => tokenizing--);
  };
  app.post<{ Body: GenerateBody }>('/tokenize', { schema: { body: GenerateBodySchema }, onRequest: admitTokenize }, async (req, reply): Promise<TokenizeResponse> => {
    const body = req.body;
    if (body.model !== model) throw new EbbError('model_not_found', `this worker serves "${model}", not "${body.model}"`);
    if (!engine.tokenize) throw new EbbError('not_found', `this worker's engine (${engine.kind}) cannot tokenize prompts`);
    const prompt = promptOf(body);
    if (prompt === undefined) throw new EbbError('invalid_request', 'one of prompt, messages or prompt_token_ids is required', { param: 'prompt' });
    const gone = new AbortController();
    // The response closing before it was sent: the caller left.
    reply.raw.once('close', () => gone.abort());
    const ids = await engine.tokenize({ prompt, messages: body.messages, prompt_token_ids: body.prompt_token_ids, continuation: body.continuation }, gone.signal);
    return { token_ids: ids };
  });
}
