/**
 * A test file for suite-isolation.test.ts to run as node --test runs one: it starts what test files
 * start (an `ebb up`, which starts a worker and a frontend of its own, a worker, an etcd), lists the
 * fleet as an operator command given no --frontend/--discovery sees it, and reports it all in one
 * stdout line. Then, as EBB_TEST_FLEET_FILE_END says, it holds everything until it is cancelled
 * ("cancel") or SIGKILLed ("kill": it starts no etcd then), or fails with everything running ("fail").
 */
import { it } from 'node:test';
import { etcdAvailable, startEtcd } from './etcd.js';
import { REPORT_PREFIX, type FleetFileReport } from './fleet-file-report.js';
import { runEbb, spawnEbb, START_BOUND_MS, startWorker, tempDiscoveryUrl } from './processes.js';

it('starts a fleet, reports it, and holds it or fails', async () => {
  const up = spawnEbb(['up', '--port', '0', '--workers', '1', '--mocker-itl-ms', '0'], 'ebb up');
  const end = process.env.EBB_TEST_FLEET_FILE_END;
  // No etcd where the file is to be SIGKILLed: nothing could stop it, nor remove its data.
  const [worker, etcd] = await Promise.all([startWorker(['--discovery', tempDiscoveryUrl(), '--model', 'm1']), etcdAvailable() && end !== 'kill' ? startEtcd() : undefined]);
  const [upWorker, upFrontend] = await Promise.all([up.waitForEvent('worker_ready', undefined, { boundMs: START_BOUND_MS }), up.waitForEvent('frontend_ready', undefined, { boundMs: START_BOUND_MS })]);
  await up.waitForStderr(/ebb is up/, START_BOUND_MS); // its state file is written before the banner: the commands find it
  const listed = await runEbb(['workers', '--json'], {});
  const report: FleetFileReport = {
    ebb: [up.pid, upWorker.pid as number, upFrontend.pid as number, worker.pid],
    tools: etcd?.pid === undefined ? [] : [etcd.pid],
    toolDirs: etcd === undefined ? [] : [etcd.dataDir],
    runtimeDir: process.env.XDG_RUNTIME_DIR as string,
    upWorker: upWorker.worker_id as string,
    listed,
  };
  process.stdout.write(`${REPORT_PREFIX}${JSON.stringify(report)}\n`);
  if (end === 'fail') throw new Error('failing, with every process it started still running');
  await new Promise<never>(() => undefined); // until cancelled or killed
});
