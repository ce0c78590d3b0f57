import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { AdminGuard } from '../../common/admin-auth.js';
import { allowOnly } from '../../common/http-server.js';
import type { AdminResponse } from '../../common/worker-admin.js';
import { errorMessageOf } from '../../common/worker-admin.js';
import { ScaleDownBodySchema, ScaleDownReportBodySchema, type DrainBody, type ScaleDownBody, type ScaleDownReportBody } from '../../protocol/admin.js';
import { codeOf, EbbError } from '../../protocol/errors.js';
import type { ScaleDownOutcome, ScaleDownRunner } from '../metrics.js';
import { ScaleDownLockHeld, lockHolder, type ScaleDownLocks } from '../../discovery/scale-down-lock.js';
import { servingCandidates, unansweredWorkers, type LiveEntry } from './fleet-capacity.js';
import { chooseVictims, isChoiceProblem } from './victim-ranking.js';


export interface ScaleDownRouteDeps {
  listWorkers: () => Promise<LiveEntry[]>;
  forwardAction: (id: string, action: 'drain' | 'resume', body: DrainBody | undefined, authorization: string | undefined) => Promise<AdminResponse<unknown>>;
  /** Discovery's: excludes every other frontend and `ebb scale-down` on the same discovery too. */
  locks: ScaleDownLocks;
  guardAdmin?: AdminGuard | undefined;
  counter?: ((outcome: ScaleDownOutcome, by?: ScaleDownRunner) => void) | undefined;
}

/**
 * POST /models/{model}/scale-down {count, deadline_ms?, pool?, dry_run?, workers?}: the frontend ranks the
 * model's serving workers as `ebb scale-down` does (victim-ranking), drains the first `count` with
 * the caller's credential, and answers 202 at once with the victims, why each was chosen, and where
 * to follow them (GET /workers/{id}, or the fleet's event stream) until they are drained and can be
 * deleted (`workers`: exactly those, as a dry run named them). It does not wait: the caller owns the deadline. If a victim refuses its drain, the ones
 * already draining are resumed and the refusal is the answer: a scale-down starts whole or not at all.
 */
export function addScaleDownRoute(app: FastifyInstance, { listWorkers, forwardAction, locks, guardAdmin, counter }: ScaleDownRouteDeps): void {
  allowOnly(app, '/models/:model/scale-down', ['POST']);
  app.post<{ Params: { model: string }; Body: ScaleDownBody }>('/models/:model/scale-down', { schema: { body: ScaleDownBodySchema } }, async (req, reply) => {
    guardAdmin?.(req.headers.authorization);
    const { model } = req.params;
    if (req.body.dry_run === true) return scaleDown(req, reply, model);
    let release: () => Promise<void>;
    try {
      release = await locks.acquire(model, lockHolder(`the frontend admin API (${req.ip})`));
    } catch (err) {
      if (err instanceof ScaleDownLockHeld) throw new EbbError('scale_down_in_progress', err.message);
      throw new EbbError('discovery_unavailable', `cannot take the scale-down lock of ${model} in discovery: ${(err as Error).message}`);
    }
    try {
      return await scaleDown(req, reply, model);
    } finally {
      await release();
    }
  });

  // `ebb scale-down --k8s-selector` drains through pod annotations, not this route: it reports its
  // scale-down here so that an alert on this frontend's counter sees it too.
  allowOnly(app, '/models/:model/scale-down/report', ['POST']);
  app.post<{ Params: { model: string }; Body: ScaleDownReportBody }>('/models/:model/scale-down/report', { schema: { body: ScaleDownReportBodySchema } }, async (req, reply) => {
    guardAdmin?.(req.headers.authorization);
    counter?.(req.body.outcome, req.body.by);
    return reply.code(204).send();
  });

  async function scaleDown(req: FastifyRequest<{ Params: { model: string }; Body: ScaleDownBody }>, reply: FastifyReply, model: string) {
    const { count } = req.body;
    const entries = await listWorkers();
    const choice = chooseVictims(model, servingCandidates(entries, model), count, req.body.pool, { named: req.body.workers, unanswered: unansweredWorkers(entries, model) });
    if (isChoiceProblem(choice)) {
      counter?.('refused');
      const known = entries.some((e) => e.model === model);
      throw new EbbError(choice.kind === 'no_workers' && !known ? 'model_not_found' : choice.kind === 'no_workers' ? 'no_serving_worker' : choice.kind === 'unanswered' ? 'worker_unreachable' : 'invalid_request', choice.message);
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
    // The generation pins the drain a caller follows (another drain or a resume bumps it).
    const answered = answers.map((a) => (a.status === 'fulfilled' ? (a.value.body as { state?: string; generation?: number }) : {}));
    return reply.code(202).send({ model, pool, count, dry_run: false, victims: victims.map((v, i) => ({ ...v, state: answered[i]?.state ?? null, generation: answered[i]?.generation ?? null, ...follow(v.worker_id) })), ranking });
  }
}
