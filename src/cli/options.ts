import { InvalidArgumentError, Option } from 'commander';
import { FLEET_NAME } from './up-state.js';
import { defaultDiscoveryDir } from '../discovery/private-dir.js';
import { workerIdProblem } from '../discovery/worker-id.js';

export function intOption(min: number) {
  return (value: string): number => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < min) throw new InvalidArgumentError(`expected an integer >= ${min}, got "${value}"`);
    return n;
  };
}

const UNIT_MS = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 } as const;

function parseDuration(value: string, bareUnit: keyof typeof UNIT_MS | undefined): number | undefined {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(value.trim());
  const unit = (m?.[2] as keyof typeof UNIT_MS | undefined) ?? bareUnit;
  if (!m || unit === undefined) return undefined;
  return Math.round(Number(m[1]) * UNIT_MS[unit]);
}

/**
 * A duration with its unit: "500ms", "30s", "10m", "1h". A bare number is refused: `--timeout 30`
 * meaning 30 ms made a busy drain "time out" at once.
 */
export function durationOption(value: string): number {
  const ms = parseDuration(value, undefined);
  if (ms === undefined) throw new InvalidArgumentError(`expected a duration with a unit, like 500ms, 30s or 10m, got "${value}"`);
  return ms;
}

/** For flags named *-ms: milliseconds as a bare number (the name says so), or any duration with a unit ("30s"). */
export function msOption(min: number) {
  return (value: string): number => {
    const ms = parseDuration(value, 'ms');
    if (ms === undefined || ms < min) throw new InvalidArgumentError(`expected milliseconds (an integer >= ${min}) or a duration like 500ms, 30s, got "${value}"`);
    return ms;
  };
}

/**
 * Components started separately on one machine meet here unless --discovery or EBB_DISCOVERY says
 * otherwise: a per-user directory ($XDG_RUNTIME_DIR/ebb/discovery, else <tmpdir>/ebb-<uid>/discovery),
 * never a shared one under /tmp that any user could write records into.
 */
export function discoveryDefault(): string {
  return process.env.EBB_DISCOVERY ?? `file://${defaultDiscoveryDir()}`;
}

/** discoveryDefault() in words: the same on every machine (the flag reference is generated from it). */
export const DISCOVERY_DEFAULT_TEXT = 'env EBB_DISCOVERY, else file://$XDG_RUNTIME_DIR/ebb/discovery, else file://$TMPDIR/ebb-<uid>/discovery';

/** A server's --discovery: a URL, by default discoveryDefault(). */
export function discoveryFlag(): Option {
  return new Option('--discovery <url>', 'memory:, file:///dir or etcd://host:2379[,host:2379]').argParser(discoveryOption).default(discoveryDefault(), DISCOVERY_DEFAULT_TEXT);
}

/** --worker-id: refused at start when it is not a worker id (see discovery/worker-id). */
export function workerIdOption(value: string): string {
  const problem = workerIdProblem(value);
  if (problem !== undefined) throw new InvalidArgumentError(`${problem}; got ${JSON.stringify(value.length > 300 ? `${value.slice(0, 300)}...` : value)}`);
  return value;
}

/** A TCP port: 0 (any free port) to 65535; said at parse time rather than as Node's listen error. */
export function portOption(value: string): number {
  const n = Number(value);
  if (!/^\d+$/.test(value.trim()) || !Number.isInteger(n) || n > 65535) throw new InvalidArgumentError(`expected a port, an integer from 0 to 65535 (0 = any free port), got "${value}"`);
  return n;
}

/**
 * A discovery URL of a form ebb knows. `file://relative/dir` is the usual slip: the URL's host is
 * then "relative" and Node's own error ("File URL host must be localhost or empty") says nothing useful.
 */
export function discoveryOption(value: string): string {
  if (value === 'memory:' || value === 'memory://' || /^etcd:\/\/[^/]+/.test(value)) return value;
  if (!value.startsWith('file://')) throw new InvalidArgumentError(`expected memory:, file:///absolute/dir or etcd://host:2379[,host:2379], got "${value}"`);
  const url = URL.canParse(value) ? new URL(value) : undefined;
  if (url === undefined) throw new InvalidArgumentError(`not a file URL: "${value}"`);
  if (url.host !== '' && url.host !== 'localhost')
    throw new InvalidArgumentError(`a file discovery URL takes an absolute path after three slashes, like file:///tmp/ebb-discovery; "${value}" names the host "${url.host}" (for ./${url.host}${url.pathname} write file://$PWD/${url.host}${url.pathname})`);
  return value;
}

/** A non-negative number (a weight): "0.5", "2". */
export function weightOption(value: string): number {
  const n = Number(value);
  if (value.trim() === '' || !Number.isFinite(n) || n < 0) throw new InvalidArgumentError(`expected a number >= 0, got "${value}"`);
  return n;
}

/** A fleet name (`ebb up --name`, the operator commands' --fleet): it becomes part of a file name. */
export function fleetNameOption(value: string): string {
  if (!FLEET_NAME.test(value)) throw new InvalidArgumentError(`expected letters, digits, ".", "_" or "-" (at most 64), got "${value}"`);
  return value;
}
