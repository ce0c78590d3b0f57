/** What helpers/fleet-file.ts reports, on one stdout line, to suite-isolation.test.ts. */

export const REPORT_PREFIX = 'FLEET_FILE ';

export interface FleetFileReport {
  /** Every ebb process it started: `ebb up`, its worker and frontend, the worker of its own. */
  ebb: number[];
  /** The other processes it started: an etcd (none where etcd is not installed, or it is to be SIGKILLed). */
  tools: number[];
  /** Their data (the etcd's), which its exit removes. */
  toolDirs: string[];
  /** Its own runtime directory (see suite-env.ts). */
  runtimeDir: string;
  upWorker: string;
  /** `ebb workers --json`, no flags. */
  listed: { code: number; stdout: string; stderr: string };
}
