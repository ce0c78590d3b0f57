import { rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { killAllNow, tempDiscoveryUrl } from '../test/helpers/processes.js';

/**
 * A fleet bench's discovery directory and its guards: on any exit the children are killed and the
 * directory removed; past `watchdogMs` the run stops (exit 3), saying so as `name`.
 */
export function guardedDiscovery(name: string, watchdogMs: number): string {
  const discovery = tempDiscoveryUrl();
  process.on('exit', () => {
    killAllNow();
    rmSync(fileURLToPath(discovery), { recursive: true, force: true });
  });
  setTimeout(() => {
    process.stderr.write(`${name}: watchdog fired, stopping\n`);
    process.exit(3);
  }, watchdogMs).unref();
  return discovery;
}
