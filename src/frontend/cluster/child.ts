import type { Logger } from 'pino';
import { startFrontend, type FrontendOptions } from '../frontend.js';
import { shutdownTimeoutFor } from '../shutdown.js';
import { KvFollower } from './kv-follow.js';
import { FRONTEND_ID_ENV, isMessage, PROCESS_SLOT_ENV, type ChildMessage, type Counts, type PrimaryMessage } from './messages.js';

export interface ChildStop {
  shutdownTimeoutMs: number;
  shutdownGraceMs: number;
}

const send = (m: ChildMessage) => process.send?.(m);

/**
 * One relaying process of `ebb frontend --processes N` (a node:cluster worker): a whole frontend on
 * the shared public port, with its own discovery watch and routing view, and no admin listener (the
 * primary has the one). It reports its in-flight counts and ranks workers by its own plus its peers'
 * (see InflightTable); /metrics is answered with every process's metrics. It stops on the primary's
 * word (or its own SIGTERM/SIGINT) with the frontend's shutdown: grace, then the deadline.
 */
export async function runChild(opts: FrontendOptions, stopOpts: ChildStop, baseLog: Logger): Promise<void> {
  const slot = Number(process.env[PROCESS_SLOT_ENV] ?? 0);
  const log = baseLog.child({ frontend_process: slot });

  // Own counts, coalesced to one message per event-loop turn: a burst of acquires costs one send.
  const changed = new Map<string, number>();
  let flushing = false;
  const flush = () => {
    flushing = false;
    const counts: Counts = [...changed];
    changed.clear();
    if (process.connected) send({ type: 'ebb:inflight', counts });
  };
  const onInflight = (workerId: string, n: number) => {
    changed.set(workerId, n);
    if (!flushing) {
      flushing = true;
      setImmediate(flush);
    }
  };

  let nextScrape = 0;
  const scrapes = new Map<number, { resolve: (text: string) => void; reject: (err: Error) => void }>();
  const scrape = () =>
    new Promise<string>((resolve, reject) => {
      const id = nextScrape++;
      scrapes.set(id, { resolve, reject });
      send({ type: 'ebb:scrape', id });
    });

  // Workers' KV events come through the primary: one subscription per worker per host, not per process.
  // Listened to before the frontend starts: its first discovery view follows workers at once.
  const kv = new KvFollower(send);
  process.on('message', (m: unknown) => {
    if (isMessage(m)) kv.onMessage(m as PrimaryMessage);
  });
  const peers = new Map<number, string>();
  const frontend = await startFrontend({ ...opts, admin: undefined, cluster: { slot, onInflight, scrape, kvSource: (r) => kv.source(r), peerUrl: (s) => peers.get(s), routedBy: process.env[FRONTEND_ID_ENV] } }, log);

  let stopping = false;
  const stop = (why: string, graceMs: number, timeoutMs: number) => {
    if (stopping) return; // the primary's word and a signal to the whole group both arrive
    stopping = true;
    log.info({ event: 'frontend_process_stopping', reason: why, grace_ms: graceMs, timeout_ms: timeoutMs }, `process ${slot} stopping (${why}): finishing open streams`);
    frontend.close(timeoutMs, graceMs).then(
      (clean) => process.exit(clean ? 0 : 1),
      (err: unknown) => {
        log.error({ err }, 'stop failed');
        process.exit(1);
      },
    );
  };

  process.on('message', (m: unknown) => {
    if (!isMessage(m)) return;
    const msg = m as PrimaryMessage;
    if (msg.type === 'ebb:peer-inflight') for (const [worker, n] of msg.counts) frontend.pool.setPeerInflight(worker, n);
    else if (msg.type === 'ebb:scraped') {
      const waiting = scrapes.get(msg.id);
      scrapes.delete(msg.id);
      if (msg.text !== undefined) waiting?.resolve(msg.text);
      else waiting?.reject(new Error(`metrics of the other frontend processes: ${msg.error ?? 'no answer'}`));
    } else if (msg.type === 'ebb:metrics-req') void frontend.registry.getMetricsAsJSON().then((metrics) => send({ type: 'ebb:metrics', id: msg.id, metrics, view: frontend.adminView() }));
    else if (msg.type === 'ebb:stop') stop('primary', msg.graceMs, msg.timeoutMs);
    else if (msg.type === 'ebb:peers') {
      peers.clear();
      for (const [s, url] of msg.urls) peers.set(s, url);
    }
  });
  process.on('SIGTERM', () => stop('SIGTERM', stopOpts.shutdownGraceMs, stopOpts.shutdownTimeoutMs));
  process.on('SIGINT', () => stop('SIGINT', 0, shutdownTimeoutFor('SIGINT', stopOpts.shutdownTimeoutMs)));
  // The primary gone without a word: node:cluster exits this process at once (its 'disconnect' handler).

  send({ type: 'ebb:ready', url: frontend.url, pid: process.pid, peer_url: frontend.peerUrl });
  log.info({ event: 'frontend_process_ready', slot, pid: process.pid, url: frontend.url }, `frontend process ${slot} (pid ${process.pid}) serving ${frontend.url}`);
}
