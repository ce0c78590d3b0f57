import cluster, { type Worker } from 'node:cluster';
import type { Logger } from 'pino';
import { AggregatorRegistry, Gauge, Registry } from 'prom-client';
import { Backoff } from '../../common/backoff.js';
import { listen } from '../../common/http-server.js';
import { collectProcessMetrics } from '../../common/process-metrics.js';
import { createAdminAgent } from '../../common/worker-admin.js';
import { connectDiscovery } from '../../discovery/connect.js';
import type { DiscoveryEvent } from '../../discovery/discovery.js';
import { createAdminServer } from '../admin/admin-server.js';
import { FleetView } from '../admin/fleet-view.js';
import type { FrontendOptions } from '../frontend.js';
import { KvFeed } from '../routing/kv-feed.js';
import { newFrontendId } from '../routing/route-marking.js';
import { shutdownTimeoutFor } from '../shutdown.js';
import { WorkerPool } from '../routing/worker-pool.js';
import { KvRelay } from './kv-relay.js';
import type { ChildStop } from './child.js';
import { mergeKv, mergeModels, type AdminView } from './admin-view.js';
import { InflightTable } from './inflight-table.js';
import { RetiredCounters } from './retired-counters.js';
import { FRONTEND_ID_ENV, isMessage, PROCESS_SLOT_ENV, type ChildMessage, type MetricsJson, type PrimaryMessage } from './messages.js';

/** A dead child is replaced after this back-off (doubling while it keeps dying; reset once one is ready). */
const REPLACE_BACKOFF = { minMs: 250, maxMs: 30_000 };
/**
 * How long a scrape waits for a child's fresh metrics before it uses the child's last answer instead
 * (well within Prometheus's default 10 s scrape timeout, with the scrape's own round trips).
 */
const METRICS_TIMEOUT_MS = 2_000;
/** Every child is asked for its metrics this often: its heartbeat, and its latest figures kept. */
const HEARTBEAT_MS = 1_000;
/**
 * A child that has answered nothing for this long is wedged (stopped, or its event loop stuck): it
 * still holds its share of the public port's new connections, which would hang, so it is killed
 * and replaced. Far above any event-loop stall of a loaded but working process.
 */
const WEDGED_MS = 5_000;

interface Slot {
  index: number;
  worker?: Worker | undefined;
  ready: boolean;
  backoff: Backoff;
  timer?: NodeJS.Timeout | undefined;
  /** When the child last answered anything (its heartbeat); 0 until it is ready. */
  answeredAt: number;
  /** Its loopback listener, where its peers pass requests for the streams it holds. */
  peerUrl?: string | undefined;
  /** Its latest metrics: kept as its figures if it stops answering or dies. */
  metrics?: MetricsJson | undefined;
  /** Its latest admin view (routing and traffic figures), for the one admin API. */
  view?: AdminView | undefined;
}

type Answer = { metrics: MetricsJson; view: AdminView };

/**
 * The primary of `ebb frontend --processes N`: it serves no API request itself. It forks N children
 * that each run a frontend on the one public port (node:cluster hands them the connections round
 * robin; Node 20's net has no SO_REUSEPORT), replaces one that dies (with a back-off, logged), sums
 * their in-flight counts for each other (InflightTable), answers their /metrics scrapes with every
 * process's metrics aggregated by prom-client (each request counted once), runs the one admin
 * listener with its own discovery watch, and on SIGTERM tells every child to drain.
 */
export async function runPrimary(opts: FrontendOptions, processes: number, stopOpts: ChildStop, log: Logger): Promise<void> {
  const discovery = await connectDiscovery(opts.discoveryUrl);
  const pool = new WorkerPool(); // in-flight here is all peers': the children's sum
  const fleet = new FleetView();
  // The one KV subscription per worker of this host (the kv router's children follow it through the relay).
  const relay = new KvRelay((w, m) => tell(w, m));
  // The children's one name on the request plane: workers count them as one frontend.
  const frontendId = newFrontendId();
  const kvFeed = (opts.router ?? 'kv') === 'kv' ? new KvFeed(log, { workerAdminToken: opts.workerAdminToken, tap: relay.tap, self: frontendId }) : undefined;
  if (kvFeed) relay.attach(kvFeed);
  const watch = await discovery.watch((event: DiscoveryEvent) => {
    pool.apply(event);
    fleet.apply(event);
    kvFeed?.apply(event);
  });
  const table = new InflightTable();
  const slots: Slot[] = Array.from({ length: processes }, (_, index) => ({ index, ready: false, backoff: new Backoff(REPLACE_BACKOFF), answeredAt: 0 }));
  const bySlotOf = new Map<Worker, Slot>();
  let stopping = false;
  /** The deadline the processes are told to stop within (a Ctrl-C's is capped: shutdownTimeoutFor). */
  let stopTimeoutMs = stopOpts.shutdownTimeoutMs;

  // --- in-flight: children's reports summed, each child told its peers' sum (coalesced per turn) ---
  let flushing = false;
  const flushPeers = () => {
    flushing = false;
    const dirty = table.flush();
    if (dirty.length === 0) return;
    for (const w of dirty) pool.setPeerInflight(w, table.total(w));
    for (const s of slots) if (s.worker?.isConnected() && s.ready) tell(s.worker, { type: 'ebb:peer-inflight', counts: table.peersOf(s.worker.id, dirty) });
  };
  const changed = () => {
    if (!flushing) {
      flushing = true;
      setImmediate(flushPeers);
    }
  };
  const tell = (w: Worker, m: PrimaryMessage) => {
    if (w.isConnected()) w.send(m);
  };

  // --- metrics: every child's registry plus this process's, aggregated once per scrape ---
  const own = new Registry();
  collectProcessMetrics(own);
  const retired = new RetiredCounters();
  let answering = 0;
  new Gauge({
    name: 'ebb_frontend_processes_answering',
    help: 'Relaying processes whose own figures are in this scrape; one that did not answer in time is counted with its last figures',
    registers: [own],
    collect() {
      this.set(answering);
    },
  });
  new Gauge({
    name: 'ebb_frontend_processes',
    help: 'Relaying processes of this frontend serving the public port (--processes)',
    registers: [own],
    collect() {
      this.set(slots.filter((s) => s.ready).length);
    },
  });
  let nextMetrics = 0;
  const metricsWaits = new Map<number, { worker: Worker; resolve: (m: Answer) => void; reject: (err: Error) => void }>();
  const childMetrics = (worker: Worker) =>
    new Promise<Answer>((resolve, reject) => {
      const id = nextMetrics++;
      const timer = setTimeout(() => {
        metricsWaits.delete(id);
        reject(new Error(`frontend process pid ${worker.process.pid} did not answer within ${METRICS_TIMEOUT_MS} ms`));
      }, METRICS_TIMEOUT_MS);
      const done = <T>(f: (v: T) => void) => (v: T) => {
        clearTimeout(timer);
        metricsWaits.delete(id);
        f(v);
      };
      metricsWaits.set(id, { worker, resolve: done(resolve), reject: done(reject) });
      tell(worker, { type: 'ebb:metrics-req', id });
    });
  /** A live child's metrics, now; kept as its latest. */
  const askSlot = async (s: Slot, worker: Worker): Promise<MetricsJson> => {
    const { metrics, view } = await childMetrics(worker);
    if (s.worker === worker) {
      s.answeredAt = performance.now();
      s.metrics = metrics;
      s.view = view;
    }
    return metrics;
  };
  // One scrape at a time: `answering` is the figure of the scrape being rendered.
  let scraping: Promise<string> = Promise.resolve('');
  const scrape = (): Promise<string> => (scraping = scraping.catch(() => '').then(scrapeNow));
  const scrapeNow = async (): Promise<string> => {
    const live = slots.flatMap((s) => (s.ready && s.worker?.isConnected() ? [{ s, worker: s.worker }] : []));
    // A child that does not answer in time is counted with its last figures, so no counter dips.
    const fresh = await Promise.allSettled(live.map(({ s, worker }) => askSlot(s, worker)));
    const children = fresh.flatMap((r, i) => (r.status === 'fulfilled' ? [r.value] : (live[i]!.s.metrics ? [live[i]!.s.metrics!] : [])));
    answering = fresh.filter((r) => r.status === 'fulfilled').length;
    const all = await Promise.all([own.getMetricsAsJSON(), retired.metrics()]);
    return AggregatorRegistry.aggregate([...children, ...all]).metrics();
  };

  // --- liveness: the heartbeat is a metrics request; a child silent for WEDGED_MS is killed (and replaced on its exit) ---
  const heartbeat = setInterval(() => {
    if (stopping) return;
    const now = performance.now();
    for (const s of slots) {
      const worker = s.worker;
      if (!worker || !s.ready) continue;
      if (now - s.answeredAt > WEDGED_MS) {
        log.warn({ event: 'frontend_process_wedged', slot: s.index, pid: worker.process.pid, silent_ms: Math.round(now - s.answeredAt) }, `frontend process ${s.index} (pid ${worker.process.pid}) answered nothing for ${WEDGED_MS} ms; killing it`);
        s.ready = false; // no longer asked, nor counted as serving
        worker.process.kill('SIGKILL');
        continue;
      }
      askSlot(s, worker).catch(() => undefined); // a missed beat is judged on the next one
    }
  }, HEARTBEAT_MS);
  heartbeat.unref();

  // --- children ---
  let resolveReady!: (url: string) => void;
  let rejectReady!: (err: Error) => void;
  const allReady = new Promise<string>((resolve, reject) => ((resolveReady = resolve), (rejectReady = reject)));
  let url: string | undefined;
  let everAllReady = false;

  const fork = (s: Slot) => {
    s.timer = undefined;
    const worker = cluster.fork({ [PROCESS_SLOT_ENV]: String(s.index), [FRONTEND_ID_ENV]: frontendId });
    s.worker = worker;
    s.ready = false;
    bySlotOf.set(worker, s);
    worker.on('message', (m: unknown) => {
      if (!isMessage(m)) return;
      const msg = m as ChildMessage;
      if (msg.type === 'ebb:inflight') {
        table.report(worker.id, msg.counts);
        changed();
      } else if (msg.type === 'ebb:ready') {
        s.ready = true;
        s.peerUrl = msg.peer_url;
        // Every process learns where the others are (this one's replacement included).
        const urls = slots.flatMap((x): Array<[number, string]> => (x.ready && x.peerUrl !== undefined ? [[x.index, x.peerUrl]] : []));
        for (const x of slots) if (x.ready && x.worker !== undefined) tell(x.worker, { type: 'ebb:peers', urls });
        s.answeredAt = performance.now();
        s.backoff.reset();
        url ??= msg.url;
        tell(worker, { type: 'ebb:peer-inflight', counts: table.peersOf(worker.id) }); // it starts knowing its peers' load
        if (stopping) tell(worker, { type: 'ebb:stop', graceMs: 0, timeoutMs: stopTimeoutMs });
        else if (slots.every((x) => x.ready)) resolveReady(msg.url);
      } else if (msg.type === 'ebb:scrape') {
        scrape().then(
          (text) => tell(worker, { type: 'ebb:scraped', id: msg.id, text }),
          (err: Error) => tell(worker, { type: 'ebb:scraped', id: msg.id, error: err.message }),
        );
      } else if (msg.type === 'ebb:metrics') metricsWaits.get(msg.id)?.resolve(msg);
      else if (msg.type === 'ebb:kv-follow') relay.follow(worker, msg.worker_id, msg.system_url, msg.follow);
      else if (msg.type === 'ebb:kv-unfollow') relay.unfollow(worker, msg.worker_id, msg.follow);
    });
  };

  const exits = new Map<number, number | null>();
  let lastExit: (() => void) | undefined;
  cluster.on('exit', (worker, code, signal) => {
    const s = bySlotOf.get(worker);
    bySlotOf.delete(worker);
    table.forget(worker.id);
    relay.childGone(worker);
    changed();
    for (const w of metricsWaits.values()) if (w.worker === worker) w.reject(new Error(`frontend process pid ${worker.process.pid} exited during the scrape`));
    if (!s || s.worker !== worker) return;
    if (s.metrics) retired.retire(s.metrics);
    s.worker = undefined;
    s.ready = false;
    s.metrics = undefined;
    s.view = undefined;
    if (stopping) {
      exits.set(s.index, code);
      if (slots.every((x) => x.worker === undefined)) lastExit?.();
      return;
    }
    const how = signal ?? `code ${code}`;
    if (!everAllReady) {
      rejectReady(new Error(`frontend process ${s.index} exited (${how}) before it was ready`));
      return;
    }
    const delay = s.backoff.next();
    log.warn({ event: 'frontend_process_exited', slot: s.index, pid: worker.process.pid, code, signal, restart_in_ms: delay }, `frontend process ${s.index} (pid ${worker.process.pid}) exited (${how}); replacing it in ${delay} ms`);
    s.timer = setTimeout(() => fork(s), delay);
  });

  for (const s of slots) fork(s);
  try {
    await allReady;
  } catch (err) {
    stopping = true;
    for (const s of slots) s.worker?.process.kill('SIGKILL');
    throw err;
  }
  everAllReady = true;

  // --- the one admin listener: the processes' routing and traffic figures from their latest heartbeat ---
  const views = () => slots.flatMap((s) => (s.view ? [s.view] : []));
  const adminAgent = opts.admin ? createAdminAgent() : undefined;
  // The router's view: the children's queued prefill summed, the KV feed's fields from the primary's own (it holds the streams).
  const kvView = (id: string) => {
    const merged = mergeKv(views(), id);
    const own = kvFeed?.describe(id) ?? null;
    return merged === null && own === null ? null : { router: 'kv', ...merged, ...own };
  };
  const adminApp = opts.admin && adminAgent ? createAdminServer({ fleet, pool, intents: discovery.drainIntents, scaleDownLocks: discovery.scaleDownLocks, kv: kvView, stats: { summary: () => mergeModels(views()) }, agent: adminAgent, guardAdmin: opts.admin.guardAdmin, workerAdminToken: opts.workerAdminToken, limits: opts.admin.limits, metricsRegistry: own }) : undefined;
  let adminUrl: string | undefined;
  if (adminApp && opts.admin) {
    try {
      adminUrl = await listen(adminApp, opts.admin.host, opts.admin.port);
    } catch (err) {
      stopping = true;
      for (const s of slots) s.worker?.process.kill('SIGKILL');
      throw new Error(`admin listener on ${opts.admin.host}:${opts.admin.port}: ${(err as Error).message}`);
    }
  }

  const stop = (signal: string, graceMs: number) => {
    if (stopping) process.exit(130);
    stopping = true;
    stopTimeoutMs = shutdownTimeoutFor(signal, stopOpts.shutdownTimeoutMs);
    clearInterval(heartbeat);
    log.info({ event: 'frontend_stopping', signal, grace_ms: graceMs, processes: slots.filter((s) => s.worker).length }, 'stopping: every process finishes its open streams');
    for (const s of slots) {
      clearTimeout(s.timer);
      if (s.worker && s.ready) tell(s.worker, { type: 'ebb:stop', graceMs, timeoutMs: stopTimeoutMs });
      // One still starting is told when it is ready.
    }
    const childrenGone = slots.every((s) => s.worker === undefined) ? Promise.resolve() : new Promise<void>((resolve) => (lastExit = resolve));
    const adminClosed = (async () => {
      if (!adminApp) return true;
      if (graceMs > 0) await new Promise((r) => setTimeout(r, graceMs));
      adminApp.server.close();
      let cut = false;
      const deadline = setTimeout(() => {
        cut = true;
        adminApp.server.closeAllConnections();
        adminAgent?.destroy().catch(() => undefined);
      }, stopTimeoutMs);
      await adminApp.close();
      clearTimeout(deadline);
      await adminAgent?.close().catch(() => undefined);
      return !cut;
    })();
    void Promise.all([childrenGone, adminClosed])
      .then(async ([, adminClean]) => {
        await watch.close();
        await kvFeed?.close();
        await discovery.close();
        const clean = adminClean && [...exits.values()].every((c) => c === 0);
        log.info({ event: 'frontend_stopped', clean }, clean ? 'every process finished its streams' : 'stopped; something had to be cut');
        process.exit(clean ? 0 : 1);
      })
      .catch((err: unknown) => {
        log.error({ err }, 'stop failed');
        process.exit(1);
      });
  };
  process.on('SIGTERM', () => stop('SIGTERM', stopOpts.shutdownGraceMs));
  process.on('SIGINT', () => stop('SIGINT', 0));
  process.once('disconnect', () => stop('SIGTERM', 0)); // started by `ebb up`, which went away
  // Ready is said once a signal is handled: a SIGTERM right after it drains.
  log.info({ event: 'admin_ready', url: adminUrl, admin_auth: opts.admin?.guardAdmin ? 'bearer' : 'none' }, `admin API ready: ${adminUrl}/workers`);
  log.info(
    { event: 'frontend_ready', url, admin_url: adminUrl, discovery: discovery.url, processes },
    `frontend ready: ${url}/v1 (admin ${adminUrl}), ${processes} processes`,
  );
  if (process.send !== undefined && !process.connected) stop('SIGTERM', 0);
}
