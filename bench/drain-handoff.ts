/**
 * Drain duration vs stream length, with and without a drain deadline (issue 11).
 *
 * Starts two mocker workers and a frontend on loopback. For each stream length it opens `--streams`
 * streams through the frontend (spread over both workers), waits until each has a few tokens, drains
 * the busier worker and times the drain: from the drain call to the worker's `drained` log line.
 * Without a deadline the drain waits for its streams to finish, so it grows with their length; with
 * `deadline_ms` the worker hands them off and the other worker continues them. Every stream must
 * complete whole either way (the run fails otherwise). The drained worker is resumed before the next point.
 *
 *   npx tsc -p . && node dist/bench/drain-handoff.js [--lengths 50,200,400,800] [--itl-ms 20] [--deadline-ms 500] [--streams 4]
 *
 * Prints a table and, last, one JSON line. Stops by itself (a watchdog bounds the run) and kills its children on any exit.
 */
import { performance } from 'node:perf_hooks';
import { call } from '../test/helpers/http.js';
import { killAllNow, startFrontend, startWorker, tempDiscoveryUrl, type FrontendHandle, type WorkerHandle } from '../test/helpers/processes.js';
import { streamCompletion } from '../test/helpers/sse.js';

interface Options {
  lengths: number[];
  itlMs: number;
  deadlineMs: number;
  streams: number;
}

function parse(argv: string[]): Options {
  const o: Options = { lengths: [50, 200, 400, 800], itlMs: 20, deadlineMs: 500, streams: 4 };
  for (let i = 0; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1] ?? ''];
    const n = Number(value);
    if (flag === '--lengths') o.lengths = value.split(',').map(Number);
    else if (flag === '--itl-ms') o.itlMs = n;
    else if (flag === '--deadline-ms') o.deadlineMs = n;
    else if (flag === '--streams') o.streams = n;
    else throw new Error(`unknown option ${flag}; options: --lengths --itl-ms --deadline-ms --streams`);
    if (flag !== '--lengths' && !(Number.isInteger(n) && n >= 0)) throw new Error(`${flag} wants an integer, got "${value}"`);
  }
  if (o.lengths.some((n) => !Number.isInteger(n) || n < 4)) throw new Error('--lengths: integers >= 4');
  return o;
}

async function inflightOf(w: WorkerHandle): Promise<number> {
  return (await call('GET', `${w.systemUrl}/engine/status`)).body.inflight_requests as number;
}

/** One point: the drain's duration in ms, and how many streams the drained worker handed off. */
async function measure(frontend: FrontendHandle, workers: WorkerHandle[], o: Options, length: number, deadline: boolean): Promise<{ ms: number; handedOff: number }> {
  let ready = 0;
  let progressed!: () => void;
  const allProgressed = new Promise<void>((resolve) => (progressed = resolve));
  const streams = Array.from({ length: o.streams }, (_, seed) =>
    streamCompletion(frontend.url, { model: 'm1', max_tokens: length, seed }, undefined, (n) => {
      if (n === 3 && ++ready === o.streams) progressed();
    }),
  );
  await allProgressed;
  const counts = await Promise.all(workers.map(inflightOf));
  const target = workers[counts.indexOf(Math.max(...counts))]!;
  const mark = target.mark();
  const t0 = performance.now();
  const drain = await call('POST', `${target.systemUrl}/engine/drain`, deadline ? { deadline_ms: o.deadlineMs } : {});
  if (drain.status !== 202 && drain.status !== 200) throw new Error(`drain answered ${drain.status}: ${JSON.stringify(drain.body)}`);
  await target.waitForEvent('state_changed', (l) => l.to === 'drained', { after: mark });
  const ms = performance.now() - t0;
  const handedOff = (await call('GET', `${target.systemUrl}/engine/status`)).body.handed_off as number;
  for (const r of await Promise.all(streams))
    if (!r.done || r.tokens !== length || r.error) throw new Error(`a stream did not complete: ${r.tokens}/${length} tokens, ${r.error ?? 'no error'}`);
  const beforeResume = frontend.mark();
  await call('POST', `${target.systemUrl}/engine/resume`);
  await frontend.waitForEvent('worker_added', (l) => l.worker_id === target.workerId, { after: beforeResume });
  return { ms, handedOff };
}

async function main(): Promise<void> {
  const o = parse(process.argv.slice(2));
  const watchdog = setTimeout(() => {
    process.stderr.write('drain-handoff: watchdog fired, stopping\n');
    killAllNow();
    process.exit(3);
  }, 60_000 + o.lengths.reduce((a, n) => a + 3 * n * o.itlMs, 0));
  watchdog.unref();
  process.on('exit', killAllNow);
  const discovery = tempDiscoveryUrl();
  const args = ['--discovery', discovery, '--model', 'm1', '--mocker-itl-ms', String(o.itlMs), '--mocker-batch-slots', '64'];
  const workers = [await startWorker(args), await startWorker(args)];
  const frontend = await startFrontend(discovery);
  const rows: Array<{ tokens: number; stream_ms: number; drain_ms: number; drain_deadline_ms: number; handed_off: number; ratio: number }> = [];
  process.stdout.write(`streams ${o.streams}, ITL ${o.itlMs} ms, deadline ${o.deadlineMs} ms\n`);
  process.stdout.write('tokens  stream(ms)  drain, no deadline(ms)  drain, deadline(ms)  handed off  no-deadline/deadline\n');
  for (const length of o.lengths) {
    const without = await measure(frontend, workers, o, length, false);
    const withDeadline = await measure(frontend, workers, o, length, true);
    const row = { tokens: length, stream_ms: length * o.itlMs, drain_ms: Math.round(without.ms), drain_deadline_ms: Math.round(withDeadline.ms), handed_off: withDeadline.handedOff, ratio: without.ms / withDeadline.ms };
    rows.push(row);
    process.stdout.write(
      `${String(length).padStart(6)}  ${String(row.stream_ms).padStart(10)}  ${String(row.drain_ms).padStart(22)}  ${String(row.drain_deadline_ms).padStart(19)}  ${String(row.handed_off).padStart(10)}  ${row.ratio.toFixed(2).padStart(20)}\n`,
    );
  }
  process.stdout.write(JSON.stringify({ bench: 'drain-handoff', itl_ms: o.itlMs, deadline_ms: o.deadlineMs, streams: o.streams, rows }) + '\n');
  await Promise.all([frontend, ...workers].map((p) => p.stop()));
}

main().catch((err: unknown) => {
  process.stderr.write(`drain-handoff: ${(err as Error).stack ?? String(err)}\n`);
  process.exitCode = 1;
});
