import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { AdminGuard } from '../../common/admin-auth.js';
import { allowOnly } from '../../common/http-server.js';
import type { AdminResponse } from '../../common/worker-admin.js';
import { errorMessageOf } from '../../common/worker-admin.js';
import { ScaleDownBodySchema, type DrainBody, type ScaleDownBody } from '../../protocol/admin.js';
import { codeOf, EbbError } from '../../protocol/errors.js';
import type { ScaleDownOutcome } from '../metrics.js';
import { servingCandidates, type LiveEntry } from './fleet-capacity.js';
import { chooseVictims, isChoiceProblem } from './victim-ranking.js';


export interface ScaleDownRouteDeps {
  listWorkers: () => Promise<LiveEntry[]>;
  forwardAction: (id: string, action: 'drain' | 'resume', body: DrainBody | undefined, authorization: string | undefined) => Promise<AdminResponse<unknown>>;
  guardAdmin?: AdminGuard | undefined;
  counter?: ((outcome: ScaleDownOutcome) => void) | undefined;
}

/**
 * POST /models/{model}/scale-down {count, deadline_ms?, pool?, dry_run?}: the frontend ranks the
 * model's serving workers as `ebb scale-down` does (victim-ranking), drains the first `count` with
 * the caller's credential, and answers 202 at once with the victims, why each was chosen, and where
 * to follow them (GET /workers/{id}, or the fleet's event stream) until they are drained and can be
 * deleted. It does not wait: the caller owns the deadline. If a victim refuses its drain, the ones
 * already draining are resumed and the refusal is the answer: a scale-down starts whole or not at all.
 */
export function addScaleDownRoute(app: FastifyInstance, { listWorkers, forwardAction, guardAdmin, counter }: ScaleDownRouteDeps): void {
  // One scale-down per model at a time: two running at once could each leave "one serving worker"
  // by their own ranking, and together drain the pool (or resume each other's victims).
  const inProgress = new Set<string>();
  allowOnly(app, '/models/:model/scale-down', ['POST']);
  app.post<{ Params: { model: string }; Body: ScaleDownBody }>('/models/:model/scale-down', { schema: { body: ScaleDownBodySchema } }, async (req, reply) => {
    guardAdmin?.(req.headers.authorization);
    const { model } = req.params;
    if (req.body.dry_run === true) return scaleDown(req, reply, model);
    if (inProgress.has(model)) throw new EbbError('scale_down_in_progress', `a scale-down of ${model} is choosing and draining its victims; retry when it has answered`);
    inProgress.add(model);
    try {
      return await scaleDown(req, reply, model);
    } finally {
      inProgress.delete(model);
    }
  });

  async function scaleDown(req: FastifyRequest<{ Params: { model: string }; Body: ScaleDownBody }>, reply: FastifyReply, model: string) {
    const { count } = req.body;
    const entries = await listWorkers();
    const choice = chooseVictims(model, servingCandidates(entries, model), count, req.body.pool);
    if (isChoiceProblem(choice)) {
      counter?.('refused');
      const known = entries.some((e) => e.model === model);
      throw new EbbError(choice.kind === 'no_workers' && !known ? 'model_not_found' : choice.kind === 'no_workers' ? 'no_serving_worker' : 'invalid_request', choice.message);
    }
    const { pool, ranking, victims } = choice;
    const follow = (id: string) => ({ status_url: `/workers/${encodeURIComponent(id)}`, events_url: '/workers/events' });
    if (req.body.dry_run === true) {
      counter?.('dry_run');
      return { model, pool, count, dry_run: true, victims: victims.map((v) => ({ ...v, ...follow(v.worker_id) })), ranking };
    }
    const drain: DrainBody = { reason: `scale-down of ${model} by ${count} (frontend admin API)`, persist: false, ...(req.body.deadline_ms !== undefined ? { deadline_ms: req.body.deadline_ms } : {}) };
    const answers = await Promise.allSettled(victims.map((v) => forwardAction(v.worker_id, 'drain', drain, req.headers.authorization)));
    const refused = answers.findIndex((a) => a.status === 'rejected' || a.value.statusCode >= 300);
    if (refused >= 0) {
      counter?.('refused');
      // All or nothing: every victim that did not refuse goes back to serving, those whose drain
      // call failed on the way too (it may have been taken); resuming a serving worker is a no-op.
      const resumes = await Promise.all(
        victims.map(async (v, i) => {
          const a = answers[i];
          if (a?.status === 'fulfilled' && a.value.statusCode >= 300) return undefined;
          const res = await forwardAction(v.worker_id, 'resume', undefined, req.headers.authorization).catch(() => undefined);
          return res !== undefined && res.statusCode < 300 ? undefined : v.worker_id;
        }),
      );
      const unresumed = resumes.filter((id): id is string => id !== undefined);
      const resumedNote = unresumed.length === 0 ? 'the other victims were resumed' : `could not resume ${unresumed.join(', ')}: resume them (POST /workers/{id}/resume)`;
      const a = answers[refused] as PromiseSettledResult<AdminResponse<unknown>>;
      const id = (victims[refused] as { worker_id: string }).worker_id;
      if (a.status === 'rejected') {
        const err = a.reason as Error;
        if (err instanceof EbbError) throw new EbbError(err.code, `scale-down of ${model} not started: victim ${id}: ${err.message}; ${resumedNote}`);
        throw err;
      }
      throw new EbbError(
        codeOf(a.value.body) ?? 'worker_unreachable',
        `scale-down of ${model} not started: victim ${id} refused its drain (HTTP ${a.value.statusCode}: ${errorMessageOf(a.value.body)}); ${resumedNote}`,
      );
    }
    counter?.('started');
    const states = answers.map((a) => (a.status === 'fulfilled' ? ((a.value.body as { state?: string }).state ?? null) : null));
    return reply.code(202).send({ model, pool, count, dry_run: false, victims: victims.map((v, i) => ({ ...v, state: states[i], ...follow(v.worker_id) })), ranking });
  }
}
