import { randomBytes } from 'node:crypto';
import type { Logger } from 'pino';
import { connectDiscovery } from '../discovery/connect.js';
import type { Discovery, LoadingRecord, WorkerRecord } from '../discovery/discovery.js';
import type { WorkerMode } from '../protocol/worker-mode.js';
import { createAdminGuard } from '../common/admin-auth.js';
import { closeBounded } from '../common/close-bounded.js';
import { advertisedUrl, listen } from '../common/http-server.js';
import type { Engine } from '../engine/engine.js';
import type { KvTransfer } from '../engine/kv-transfers.js';
import { createEngine, type EngineSpec } from '../engine/create-engine.js';
import { Admission } from '../lifecycle/admission.js';
import { defaultPriorityReserve, PriorityReserve } from './priority-reserve.js';
import { Lifecycle } from '../lifecycle/lifecycle.js';
import { createWorkerMetrics } from './metrics.js';
import { PrefillPeers } from './prefill-peers.js';
import { registerKvStateMetrics } from './kv-state-metrics.js';
import { createRequestPlane } from './request-plane.js';
import { RoutedLoad } from './routed-load.js';
import { ENGINE_FAILED_EXIT_CODE, runShutdown, type ShutdownDeps, type ShutdownOptions } from './shutdown.js';
import { createSystemServer } from './system-server.js';
import { WorkerPhase } from './phase.js';
import { WorkerRegistration } from './worker-registration.js';
import { DEFAULT_REGISTER_TIMEOUT_MS, registerFirst } from './first-registration.js';
import { adoptDrainIntent, DEFAULT_DRAIN_INTENT_TTL_MS, followDrainIntent } from './drain-intent-sync.js';
import { WorkerAdapters } from './adapters.js';
import { AdapterPolicy, adapterFilesOf } from './adapter-policy.js';
import { registerAdapterMetrics } from './adapter-metrics.js';
import type { Transition } from '../lifecycle/lifecycle.js';
import { MemoryDiscovery } from '../discovery/memory.js';
import type { OpenAIPortOptions } from './openai-port.js';
import { RoutedBy } from './routed-by.js';

export interface WorkerOptions {
  workerId?: string | undefined;
  model: string;
  mode: WorkerMode;
  host: string;
  port: number;
  systemHost: string;
  systemPort: number;
  /** Host put in the registered URLs (default: the bound address, or the hostname when bound to a wildcard). */
  advertiseHost?: string | undefined;
  discoveryUrl: string;
  leaseTtlMs?: number | undefined;
  /** How long the first registration is retried before the worker gives up (default 30 s). */
  registerTimeoutMs?: number | undefined;
  /** With etcd discovery: how long an operator's drain outlives the process (default 24 h). */
  drainIntentTtlMs?: number | undefined;
  shutdown: Omit<ShutdownOptions, 'watchdogMarginMs'> & { watchdogMarginMs?: number };
  engine: EngineSpec;
  guardAdmin?: (authorization: string | undefined) => void;
  /** The request-plane token: required of callers when set, and sent to prefill peers. */
  requestToken?: string | undefined;
  /**
   * Start drained instead of registering (a drain intent that outlived the previous process, e.g.
   * the Pod's ebb.dev/drain annotation): the worker never takes traffic until resumed.
   */
  startDrained?: { reason: string; deadlineMs?: number | undefined } | undefined;
  /** Also serve the OpenAI API for this worker alone (--openai-port; see openai-port.ts). */
  openai?: OpenAIPortOptions | undefined;
  /** Batch slots flex requests leave free for priority and default ones (default: defaultPriorityReserve). */
  priorityReserveSlots?: number | undefined;
  /** The most tokens one embedding request may carry, all its inputs together (default: OpenAI's 300,000). */
  maxEmbeddingTokens?: number | undefined;
  /** --lora-dir: where an admin load may read adapters the worker was not started with (adapter-policy.ts). */
  loraDirs?: string[] | undefined;
}

export interface RunningWorker {
  record: WorkerRecord;
  lifecycle: Lifecycle;
  engine: Engine;
  discovery: Discovery;
  /** The --openai-port listener's URL, when one was asked for. */
  openaiUrl?: string | undefined;
  /** Runs the SIGTERM sequence once; later calls get the same promise. Resolves with the exit code. */
  shutdown(signal: string): Promise<number>;
  /** A second signal: the stage under way and the rest are cancelled; cleanup still runs, briefly. */
  cancelShutdown(): void;
}

export function newWorkerId(): string {
  return `w-${randomBytes(4).toString('hex')}`;
}

export { ENGINE_FAILED_EXIT_CODE };

/**
 * The record follows the adapters' states: the changes of one turn written once (an eviction and
 * the load it makes room for are one put), never per request. A worker drain drains them with it.
 */
function followAdapters(adapters: WorkerAdapters, lifecycle: Lifecycle, record: WorkerRecord): void {
  let queued = false;
  adapters.on('change', () => {
    if (queued) return;
    queued = true;
    setImmediate(() => {
      queued = false;
      record.adapters = adapters.record();
      void lifecycle.republish();
    });
  });
  lifecycle.on('transition', (t: Transition) => {
    if (t.to === 'draining') adapters.drainAll('worker drain');
    else if (t.to === 'serving') adapters.retryFailedUnloads();
  });
}

/**
 * Registers the worker as loading while its engine loads, unless it will start drained (told so, or
 * under a drain intent discovery keeps): the frontends then hold its model's requests for it. Says
 * how that went in one line (`loading_announced`), which `ebb up` waits for before it starts its
 * frontend, so the first requests find the model coming rather than unknown.
 */
async function announceLoading(key: WorkerRegistration, discovery: Discovery, loading: LoadingRecord, startsDrained: boolean, log: Logger): Promise<void> {
  let why: string | undefined;
  if (startsDrained) why = 'it starts drained';
  else if ((await discovery.drainIntents?.get(loading.worker_id).catch(() => undefined)) !== undefined) why = 'a drain intent holds it';
  else {
    const outcome = await key.announce(loading);
    if (outcome === 'superseded') why = 'its loading was over first';
    else if (outcome === 'failed') why = 'discovery did not take the record';
  }
  if (why === undefined) log.info({ event: 'loading_announced', registered: true, model: loading.model }, `registered in discovery as loading: requests for "${loading.model}" wait for this worker`);
  else log.info({ event: 'loading_announced', registered: false, reason: why }, `not registered as loading: ${why}`);
}

/**
 * Starts a worker: the system server first (it answers while the engine loads: /live 200, /health
 * 503 loading) and its loading record, then the engine, then the request plane; its serving record
 * replaces the loading one last, once it can serve. Aborting `loading` (SIGTERM while a model loads) stops the load; startWorker then rejects.
 */
export async function startWorker(opts: WorkerOptions, log: Logger, exit: (code: number) => void, loading: AbortSignal = new AbortController().signal): Promise<RunningWorker> {
  const workerId = opts.workerId ?? newWorkerId();
  // The lifecycle first: `loading` is its state while the engine loads, and the system server reads it.
  let loaded: Engine | undefined;
  const admission = new Admission(() => loaded?.isOverloaded() ?? true);
  let record: WorkerRecord | undefined;
  // The --openai-port's routing view: this registration, in once discovery confirmed it, out before discovery is told.
  const own = opts.openai === undefined ? undefined : new MemoryDiscovery();
  const discovery = await connectDiscovery(opts.discoveryUrl, { leaseTtlMs: opts.leaseTtlMs });
  const key = new WorkerRegistration(discovery, log);
  const lifecycle = new Lifecycle(
    workerId,
    admission,
    undefined,
    {
      register: async () => {
        await key.register(record as WorkerRecord);
        await own?.register(record as WorkerRecord);
      },
      unregister: async () => {
        await own?.unregister(workerId);
        await key.unregister(workerId);
      },
    },
    log,
  );
  // Out of loading other than into serving (drained before it registered, starting drained, a shutdown): no request waits for it.
  lifecycle.on('transition', (t: Transition) => {
    if (t.from === 'loading' && t.to !== 'serving') void key.withdraw(workerId);
  });
  lifecycle.loadingDetail = `starting engine ${opts.engine.kind}`;
  const phase = new WorkerPhase(lifecycle);
  const systemServer = createSystemServer({ phase, workerId, guardAdmin: opts.guardAdmin, requestToken: opts.requestToken });
  const systemUrl = advertisedUrl(await listen(systemServer, opts.systemHost, opts.systemPort), opts.advertiseHost);
  log.info({ event: 'worker_loading', worker_id: workerId, engine: opts.engine.kind, system_url: systemUrl }, `worker ${workerId} loading engine ${opts.engine.kind}; system server ${systemUrl}`);
  void announceLoading(key, discovery, { worker_id: workerId, model: opts.model, mode: opts.mode, system_url: systemUrl, engine: opts.engine.kind, loading: { since: new Date().toISOString() } }, opts.startDrained !== undefined, log);
  let engine: Engine;
  try {
    engine = await createEngine(opts.engine, opts.mode, log, loading);
  } catch (err) {
    await key.withdraw(workerId);
    await discovery.close();
    await closeBounded(systemServer, AbortSignal.timeout(2000));
    throw err;
  }
  loaded = engine;
  lifecycle.engineLoaded(engine);

  const metrics = createWorkerMetrics(admission, lifecycle, engine, opts.model);
  engine.kvTransfers?.on('expired', (t: KvTransfer) =>
    log.warn({ event: 'kv_transfer_expired', transfer_id: t.transfer_id, kv_bytes: t.kv_bytes }, `KV transfer ${t.transfer_id} expired before a decode peer took it`),
  );
  // Decode workers pull prefills' KV; engines that load KV state also take hand-offs' from any worker.
  const prefillPeers = opts.mode === 'decode' || engine.importKv ? new PrefillPeers() : undefined;
  const kvPulls = registerKvStateMetrics(metrics.registry, engine);
  const adapters = engine.adapters === undefined ? undefined : new WorkerAdapters(engine.adapters, log, new AdapterPolicy({ model: opts.model, dirs: opts.loraDirs ?? [], files: adapterFilesOf(engine.kind) }));
  if (adapters !== undefined) {
    await adapters.adoptResident();
    registerAdapterMetrics(metrics.registry, adapters);
  }
  await prefillPeers?.start(discovery);
  const priorityReserve = new PriorityReserve(() => engine.stats().batch_slots, opts.priorityReserveSlots ?? defaultPriorityReserve(engine.stats().batch_slots), admission);
  let requestUrl = '';
  // Told to the frontends only where the engine publishes KV events (the stream it rides on).
  const routedLoad = engine.kvEvents === undefined ? undefined : new RoutedLoad();
  const requestPlane = createRequestPlane({
    model: opts.model,
    workerId,
    mode: opts.mode,
    engine,
    admission,
    metrics,
    log,
    selfUrl: () => requestUrl,
    prefillPeers,
    guard: createAdminGuard(opts.requestToken, 'request-plane'),
    requestToken: opts.requestToken,
    onKvPull: kvPulls,
    adapters,
    drainEtaMs: () => lifecycle.status().eta_ms ?? null,
    priorityReserve,
    maxEmbeddingTokens: opts.maxEmbeddingTokens,
    audit: { trail: lifecycle.audit, generation: () => lifecycle.status().generation },
    routedLoad,
  });
  lifecycle.setEtaSource(() => requestPlane.drainEta());
  // An Admin drain's deadline passed with streams still running: hand them off to other workers.
  lifecycle.on('handoff_due', () => {
    const { count, closed } = requestPlane.handOffAll();
    lifecycle.recordHandoffs(count, closed);
  });

  requestUrl = advertisedUrl(await listen(requestPlane.app, opts.host, opts.port), opts.advertiseHost);
  const kvCache = engine.kvCache ?? engine.kvEvents?.declaration;
  record = { worker_id: workerId, model: opts.model, mode: opts.mode, request_url: requestUrl, system_url: systemUrl, engine: engine.kind, capabilities: engine.capabilities, ...(kvCache ? { kv_cache: kvCache } : {}), ...(adapters ? { adapters: adapters.record() } : {}) };
  if (adapters !== undefined) followAdapters(adapters, lifecycle, record);
  // Loaded only with --openai-port: it brings the frontend's modules.
  const openaiPort = opts.openai === undefined ? undefined : await import('./openai-port.js');
  const openai = openaiPort && own && opts.openai ? await openaiPort.startOpenAIPort(opts.openai, own, record, opts.requestToken, log) : undefined;
  discovery.onRegistrationLost((id) => {
    if (id === workerId) void lifecycle.registrationLost();
  });
  // Ready for a rollout (GET /ready) once every frontend marks this worker as one it routes to.
  const routedBy = new RoutedBy(discovery.routeMarks, workerId, log);
  await routedBy.start();
  phase.running({ lifecycle, engine, metrics, drainEta: () => requestPlane.drainEta(), adapters, priorityReserve, routedLoad, routedBy });
  const intents = discovery.drainIntents;
  const intentTtlMs = opts.drainIntentTtlMs ?? DEFAULT_DRAIN_INTENT_TTL_MS;
  // Followed from here: an operator may drain the worker while its first registration is retried.
  if (intents !== undefined) followDrainIntent(lifecycle, intents, record, intentTtlMs, log);
  // One start attempt, retried while discovery is unreachable: an operator's drain outlives the
  // process (a Pod annotation, or an intent kept in etcd), so a restart under one comes back drained.
  try {
    await registerFirst(opts.registerTimeoutMs ?? DEFAULT_REGISTER_TIMEOUT_MS, discovery.url, log, loading, async () => {
      let startDrained = opts.startDrained;
      if (startDrained === undefined && intents !== undefined) {
        const intent = await intents.get(workerId);
        if (intent) {
          startDrained = { reason: `drain intent in ${discovery.url} (since ${intent.at}): ${intent.reason}` };
          await adoptDrainIntent(intents, intent, record as WorkerRecord, intentTtlMs);
        }
      }
      if (startDrained === undefined) return lifecycle.start();
      log.info({ event: 'start_drained', reason: startDrained.reason }, `starting drained (not registered): ${startDrained.reason}`);
      // Not a new intent: the one it starts under is kept as it is (a Pod annotation keeps itself).
      await lifecycle.drain(startDrained.reason, { deadlineMs: startDrained.deadlineMs, persist: false });
    });
  } catch (err) {
    await key.withdraw(workerId); // it will not serve: nothing waits for it
    throw err;
  }

  const cleanup = async (signal: AbortSignal) => {
    await Promise.all([closeBounded(requestPlane.app, signal), closeBounded(systemServer, signal), openai && openaiPort?.closeOpenAIPort(openai, signal)]);
    await prefillPeers?.close();
    await routedBy.close();
    await discovery.close();
    await engine.close();
  };
  let shuttingDown: Promise<number> | undefined;
  const cancel = new AbortController();
  const shutdownOpts: ShutdownOptions = { watchdogMarginMs: 5000, ...opts.shutdown };

  const shutdownDeps: ShutdownDeps = {
    lifecycle,
    admission,
    metrics,
    log,
    cutInflight: (s) => requestPlane.cutAll(s),
    handOffInflight: () => {
      const { count, closed } = requestPlane.handOffAll();
      lifecycle.recordHandoffs(count, closed);
      return { count, closed };
    },
    cleanup,
    exit,
    cancel: cancel.signal,
  };

  // An engine that died cannot finish what was admitted: the one shutdown, without grace or wait
  // (leave discovery, end every stream with an explicit error, close), /live fails, and the exit is
  // non-zero so the supervisor restarts the worker.
  engine.onFailure?.((err) => {
    if (lifecycle.engineFailure !== undefined) return;
    log.fatal({ event: 'engine_failed', err: err.message, inflight: admission.inflightIds() }, `engine failed: ${err.message}; leaving discovery and exiting`);
    if (shuttingDown !== undefined) {
      lifecycle.engineFailed(err.message);
      cancel.abort(new Error('engine failed')); // the shutdown under way cuts what is left and exits
      return;
    }
    shuttingDown = runShutdown({ engineFailure: err.message }, shutdownOpts, shutdownDeps);
    void shuttingDown.then(exit, (e: unknown) => {
      log.error({ event: 'engine_failed_cleanup', err: (e as Error).message }, `shutdown after the engine failure failed: ${(e as Error).message}`);
      exit(ENGINE_FAILED_EXIT_CODE);
    });
  });

  return {
    record,
    lifecycle,
    engine,
    discovery,
    openaiUrl: openai && advertisedUrl(openai.url, opts.advertiseHost),
    shutdown(signal) {
      shuttingDown ??= runShutdown({ signal }, shutdownOpts, shutdownDeps);
      return shuttingDown;
    },
    cancelShutdown() {
      cancel.abort(new Error('second signal'));
    },
  };
}
