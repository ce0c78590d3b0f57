/**
 * Ports for servers a test stops and starts again on the same port (etcd, Redis, a frontend behind
 * nginx), or spawns after choosing it. A port the kernel handed out with listen(0) lies in the
 * ephemeral range, from which every outgoing connection on the machine also takes its local port:
 * while such a server is down (or not yet up), any connection may take its port, and the restart
 * fails with "address already in use" (seen under a loaded full run). Ports below that range are
 * never handed out on their own; they are chosen at random (test files run side by side), and
 * each is checked free with a bind.
 */
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';

const FLOOR = 10_000;
const taken = new Set<number>();

/** The first port of the kernel's ephemeral range (Linux's default where it cannot be read). */
function ephemeralLow(): number {
  try {
    const low = Number(readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/)[0]);
    return Number.isInteger(low) && low > FLOOR + 1000 ? low : 32_768;
  } catch {
    return 32_768;
  }
}

function bindable(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once('error', () => resolve(false));
    server.listen(port, '127.0.0.1', () => server.close(() => resolve(true)));
  });
}

/**
 * `count` distinct free loopback ports that no outgoing connection will take meanwhile; with
 * `pairedAt`, each port's twin that far above it is free and below the ephemeral range too (a Redis
 * Cluster node listens on its port and on its bus, the port + 10000).
 */
export async function stablePorts(count: number, pairedAt?: number): Promise<number[]> {
  const offsets = pairedAt === undefined ? [0] : [0, pairedAt];
  const span = ephemeralLow() - FLOOR - (pairedAt ?? 0);
  if (span < 1000) throw new Error(`too few ports below the ephemeral range (from ${ephemeralLow()}) for ports ${pairedAt} apart`);
  const out: number[] = [];
  for (let tries = 0; out.length < count; tries++) {
    if (tries > 1000) throw new Error(`no free port below the ephemeral range after ${tries} tries`);
    const port = FLOOR + Math.floor(Math.random() * span);
    const all = offsets.map((o) => port + o);
    if (all.some((p) => taken.has(p))) continue;
    // Reserved before the check: calls side by side (Promise.all) never get the same port.
    for (const p of all) taken.add(p);
    if ((await Promise.all(all.map(bindable))).every(Boolean)) out.push(port);
    else for (const p of all) taken.delete(p);
  }
  return out;
}

/** Ports for Redis Cluster nodes: each one's bus port (the port + 10000) free and stable too. */
export const clusterPorts = (count: number) => stablePorts(count, 10_000);

export async function stablePort(): Promise<number> {
  return (await stablePorts(1))[0]!;
}
