/**
 * How long after a drain call returns does a frontend stop routing to the drained worker, with etcd
 * discovery? Starts its own etcd, one worker and one frontend (real processes), then per round:
 * POST /engine/drain, and time from the moment that call returned to the moment this process reads
 * the frontend's `worker_removed` line for the worker on the frontend's stdout pipe (both on this
 * process's monotonic clock). Then resume, and wait for `worker_added` before the next round.
 *
 *   npx tsc -p . && node dist/bench/etcd-watch-latency.js [rounds=50]
 *
 * The latency can be slightly negative: the worker deletes its key before answering the drain call,
 * so etcd may notify the frontend before the drain response reaches us. Also reported: the same
 * interval measured from when the drain call was sent (always positive, an upper bound), and from
 * the frontend's own log `time` (wall clock, millisecond resolution) to the wall time the call returned.
 */
import { performance } from 'node:perf_hooks';
import { call } from '../test/helpers/http.js';
import { etcdBinary, startEtcd, type EtcdServer } from '../test/helpers/etcd.js';
import { startFrontend, startWorker, type EbbProcess, type LogLine } from '../test/helpers/processes.js';
import { percentile } from './percentile.js';

const ROUNDS = Number(process.argv[2] ?? 50);
if (!Number.isInteger(ROUNDS) || ROUNDS < 1) throw new Error(`rounds must be a positive integer, got ${process.argv[2]}`);

/** Resolves with the first line at index >= `after` matching `pred`, and when (monotonic ms) it was read. */
function readAfter(p: EbbProcess, after: number, what: string, pred: (l: LogLine) => boolean): Promise<{ line: LogLine; readAt: number }> {
  let readAt = 0;
  return p
    .waitForLog(
      (l) => {
        if (!pred(l)) return false;
        readAt = performance.now(); // called synchronously from the stdout line handler
        return true;
      },
      what,
      { after },
    )
    .then((line) => ({ line, readAt }));
}

function stats(values: number[]) {
  const s = [...values].sort((a, b) => a - b);
  const r = (v: number) => Math.round(v * 100) / 100;
  return { median: r(percentile(s, 50)), p90: r(percentile(s, 90)), p99: r(percentile(s, 99)), min: r(s[0] as number), max: r(s[s.length - 1] as number) };
}

async function main(): Promise<void> {
  if (!etcdBinary()) throw new Error('etcd not installed: install etcd-server or set ETCD_BIN');
  const processes: EbbProcess[] = [];
  let etcd: EtcdServer | undefined;
  const cleanup = async () => {
    await Promise.all(processes.map((p) => p.stop()));
    await etcd?.stop();
  };
  const onSignal = () => void cleanup().finally(() => process.exit(130));
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    etcd = await startEtcd();
    const worker = await startWorker(['--discovery', etcd.url, '--model', 'bench']);
    processes.push(worker);
    const frontend = await startFrontend(etcd.url);
    processes.push(frontend);
    const id = worker.workerId;
    await frontend.waitForLog(
      (l) => (l.event === 'discovery_reset' && (l.workers as string[]).includes(id)) || (l.event === 'worker_added' && l.worker_id === id),
      'the frontend to list the worker',
    );

    const fromReturn: number[] = [];
    const fromSend: number[] = [];
    const fromReturnLogTime: number[] = [];
    const drainCall: number[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      const removed = readAfter(frontend, frontend.mark(), `worker_removed ${id}`, (l) => l.event === 'worker_removed' && l.worker_id === id);
      const sent = performance.now();
      const drain = await call('POST', `${worker.systemUrl}/engine/drain`);
      const returned = performance.now();
      const returnedWall = Date.now();
      if (drain.status !== 200 && drain.status !== 202) throw new Error(`drain answered ${drain.status}: ${JSON.stringify(drain.body)}`);
      const { line, readAt } = await removed;
      fromReturn.push(readAt - returned);
      fromSend.push(readAt - sent);
      fromReturnLogTime.push(Date.parse(line.time as string) - returnedWall);
      drainCall.push(returned - sent);

      const added = readAfter(frontend, frontend.mark(), `worker_added ${id}`, (l) => l.event === 'worker_added' && l.worker_id === id);
      const resumed = await call('POST', `${worker.systemUrl}/engine/resume`);
      if (resumed.status !== 200) throw new Error(`resume answered ${resumed.status}: ${JSON.stringify(resumed.body)}`);
      await added;
    }

    const summary = {
      bench: 'etcd-watch-latency',
      rounds: ROUNDS,
      unit: 'ms',
      /** Rounds in which the frontend had already dropped the worker when the drain call returned. */
      removed_before_drain_returned: fromReturn.filter((v) => v <= 0).length,
      drain_returned_to_frontend_worker_removed: stats(fromReturn),
      drain_sent_to_frontend_worker_removed: stats(fromSend),
      drain_returned_to_frontend_log_time: stats(fromReturnLogTime),
      drain_call: stats(drainCall),
    };
    const a = summary.drain_returned_to_frontend_worker_removed;
    console.log(`etcd watch latency over ${ROUNDS} drains (drain call returned -> frontend's worker_removed line read on its stdout):`);
    console.log(`  median ${a.median} ms, p99 ${a.p99} ms (min ${a.min}, max ${a.max}); removed before the call returned in ${summary.removed_before_drain_returned}/${ROUNDS} rounds`);
    const b = summary.drain_sent_to_frontend_worker_removed;
    console.log(`  from drain call sent: median ${b.median} ms, p99 ${b.p99} ms; drain call itself: median ${summary.drain_call.median} ms`);
    console.log(JSON.stringify(summary));
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    await cleanup();
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exitCode = 1;
});
