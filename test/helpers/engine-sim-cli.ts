#!/usr/bin/env node
/**
 * An engine simulator as its own process, for `--engine-cmd` tests:
 *   node dist/test/helpers/engine-sim-cli.js --port N --kind vllm [--itl-ms 20] [--load-ms 0] [--ignore-sigterm]
 * It says what happens to it on stdout (the worker relays that to its stderr, prefixed), exits 0 on
 * SIGTERM, and exits when its stdin closes (the worker that started it is gone).
 */
import { parseArgs } from 'node:util';
import { startEngineSim, type SimKind } from './engine-sim.js';

const { values } = parseArgs({
  options: {
    port: { type: 'string' },
    kind: { type: 'string', default: 'vllm' },
    'itl-ms': { type: 'string', default: '20' },
    'load-ms': { type: 'string', default: '0' },
    model: { type: 'string', default: 'sim-model' },
    'ignore-sigterm': { type: 'boolean', default: false },
  },
});
if (values.port === undefined) {
  process.stderr.write('engine-sim: --port is required\n');
  process.exit(2);
}
const sim = await startEngineSim({
  kind: values.kind as SimKind,
  port: Number(values.port),
  itlMs: Number(values['itl-ms']),
  loadMs: Number(values['load-ms']),
  model: values.model,
});
process.stdout.write(`engine-sim ${sim.kind} listening on ${sim.url} (pid ${process.pid})\n`);
process.on('SIGTERM', () => {
  if (values['ignore-sigterm']) {
    process.stdout.write('engine-sim: SIGTERM received, ignoring it\n');
    return;
  }
  process.stdout.write('engine-sim: SIGTERM received, stopping\n');
  void sim.close().then(() => process.exit(0));
});
process.stdin.resume();
process.stdin.on('end', () => process.exit(0));
