import { InvalidArgumentError } from 'commander';
import { defaultDiscoveryDir } from '../discovery/private-dir.js';

export function intOption(min: number) {
  return (value: string): number => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < min) throw new InvalidArgumentError(`expected an integer >= ${min}, got "${value}"`);
    return n;
  };
}

/** "90s", "10m", "1h", "500ms" or plain milliseconds. */
export function durationOption(value: string): number {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(value.trim());
  if (!m) throw new InvalidArgumentError(`expected a duration like 500ms, 30s, 10m, got "${value}"`);
  const scale = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[(m[2] ?? 'ms') as 'ms' | 's' | 'm' | 'h'];
  return Math.round(Number(m[1]) * scale);
}

/**
 * Components started separately on one machine meet here unless --discovery or EBB_DISCOVERY says
 * otherwise: a per-user directory ($XDG_RUNTIME_DIR/ebb/discovery, else <tmpdir>/ebb-<uid>/discovery),
 * never a shared one under /tmp that any user could write records into.
 */
export function discoveryDefault(): string {
  return process.env.EBB_DISCOVERY ?? `file://${defaultDiscoveryDir()}`;
}
