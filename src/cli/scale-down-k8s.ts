import { destination, pino } from 'pino';
import { printable } from '../common/terminal-text.js';
import { errorMessageOf, type WorkerStatus } from '../common/worker-admin.js';
import type { ScaleDownReportBody } from '../protocol/admin.js';
import { chooseVictims, isChoiceProblem, type Candidate } from '../frontend/admin/victim-ranking.js';
import { K8sError } from '../k8s/k8s-error.js';
import { AdminClient, withClient, type FleetEntry } from './admin-client.js';
import { CliError, EXIT_FAILURE, EXIT_TIMEOUT } from './cli-error.js';
import { rankingTable, say, type ScaleDownFlags } from './scale-down-output.js';
import { formatDuration } from './progress-line.js';

/**
 * `ebb scale-down --k8s-selector`: the victims are pods. Each serving pod is ranked by its worker's
 * own status, read through --frontend or --discovery (a pod's worker is the one whose id is the
 * pod's name, as the manifests in deploy/kubernetes run it); without a fleet source, or for a pod
 * whose worker it does not list, only the pod's age is known (its drain time counts as unknown).
 */
export async function scaleDownPods(selector: string, flags: ScaleDownFlags, model: string): Promise<void> {
  // Loaded on demand, as for rollout: the Kubernetes client is dozens of modules.
  const [{ createDeploymentScaleApi, createPodApi, defaultNamespace, loadKubeConfig }, { k8sScaleDown, servingPods }] = await Promise.all([import('../k8s/client.js'), import('../k8s/scale-down.js')]);
  let kc;
  try {
    kc = loadKubeConfig(flags.kubeconfig);
  } catch (err) {
    throw new CliError(`--k8s-selector: ${(err as Error).message}`);
  }
  const namespace = flags.namespace ?? defaultNamespace(kc);
  let deployment: string | undefined;
  if (flags.k8sScale !== undefined) {
    const m = /^(?:deployment|deploy|deployments)(?:\.apps)?\/(.+)$/.exec(flags.k8sScale);
    if (!m) throw new CliError(`--k8s-scale expects deployment/NAME, got "${flags.k8sScale}"`);
    deployment = m[1] as string;
  }
  const api = createPodApi(kc);
  const toCli = (err: unknown): never => {
    if (err instanceof K8sError) throw new CliError(err.message, err.kind === 'timed_out' ? EXIT_TIMEOUT : EXIT_FAILURE);
    throw err;
  };
  const pods = await servingPods(api, namespace, selector).catch(toCli);
  const hasSource = flags.frontend !== undefined || flags.discovery !== undefined || process.env.EBB_DISCOVERY !== undefined;
  const fleet: FleetEntry[] = hasSource ? await withClient(flags, (client) => client.fleet(AdminClient.CALL_TIMEOUT_MS)) : [];
  const byId = new Map(fleet.map((e) => [e.worker_id, e]));
  const candidates: Candidate[] = [];
  for (const pod of pods) {
    const name = pod.metadata?.name ?? '';
    const entry = byId.get(name);
    if (entry !== undefined && entry.model !== model) continue; // another model's worker under the same labels
    const created = pod.metadata?.creationTimestamp;
    const status =
      entry?.status?.state === 'serving'
        ? entry.status
        : ({ worker_id: name, state: 'serving', inflight_requests: 0, eta_if_drained_ms: null, started_at: created === undefined ? undefined : new Date(created).toISOString() } as unknown as WorkerStatus);
    candidates.push({ worker_id: name, mode: entry?.mode ?? flags.pool ?? 'aggregated', status });
  }
  const choice = chooseVictims(model, candidates, flags.count, flags.pool, { named: flags.workers });
  if (isChoiceProblem(choice)) {
    await reportToFrontend(flags, model, 'refused');
    throw new CliError(`${choice.message} among pods ${selector} in ${namespace}`);
  }
  const { pool, ranking, victims } = choice;
  const report = { model, pool, count: flags.count, dry_run: flags.dryRun === true, namespace, selector, victims, ranking };
  if (!hasSource) say(`no --frontend or --discovery: the pods are ranked by age only (youngest first)`);
  await reportToFrontend(flags, model, flags.dryRun ? 'dry_run' : 'started');
  if (flags.dryRun) {
    process.stdout.write(flags.json ? `${JSON.stringify(report, null, 2)}\n` : `scale-down of ${printable(model)} pods ${printable(selector)} by ${flags.count} would take:\n${rankingTable(ranking, victims)}\n`);
    return;
  }
  const started = Date.now();
  say(`scale-down of pods ${selector} in ${namespace} by ${flags.count}: ${victims.map((v) => v.worker_id).join(', ')}`);
  const result = await k8sScaleDown(
    api,
    {
      namespace,
      selector,
      victims: victims.map((v) => v.worker_id),
      timeoutMs: flags.timeout,
      drainDeadlineMs: flags.drainDeadline,
      reason: `ebb scale-down ${model} by ${flags.count}`,
      scale: deployment === undefined ? undefined : { api: createDeploymentScaleApi(kc), deployment },
      say,
    },
    pino({ level: process.env.EBB_LOG_LEVEL ?? 'warn', base: { component: 'scale-down' } }, destination({ dest: 2, sync: true })),
  ).catch(toCli);
  if (flags.json) process.stdout.write(`${JSON.stringify({ ...report, result }, null, 2)}\n`);
  else
    process.stdout.write(
      `scale-down of pods ${printable(selector)} by ${flags.count} done in ${formatDuration(Date.now() - started)}: ${printable(victims.map((v) => v.worker_id).join(', '))} ` +
        (result.action === 'deleted' ? 'drained and deleted\n' : `drained; deployment/${printable(result.deployment)} scaled ${result.from} -> ${result.to}\n`),
    );
}

/**
 * Tells the --frontend of this scale-down, which its ebb_frontend_scale_downs_total counts (by="k8s"):
 * the drains go through pod annotations, never through the frontend's own scale-down route. A
 * frontend that does not take it is said, not fatal: the scale-down itself needs no frontend.
 */
async function reportToFrontend(flags: ScaleDownFlags, model: string, outcome: ScaleDownReportBody['outcome']): Promise<void> {
  if (flags.frontend === undefined) return;
  const body: ScaleDownReportBody = { by: 'k8s', outcome };
  await withClient(flags, async (client) => {
    const res = await client.call(`${client.source.url}/models/${encodeURIComponent(model)}/scale-down/report`, 'POST', client.sourceLabel, body);
    if (res.statusCode !== 204) say(`${client.sourceLabel} did not count this scale-down: HTTP ${res.statusCode}: ${errorMessageOf(res.body)}`);
  }).catch((err: Error) => say(`the frontend did not count this scale-down: ${err.message}`));
}
