import { readFileSync } from 'node:fs';

/**
 * A process's peak resident set (VmHWM in /proc/PID/status), in bytes: what a container's memory
 * limit must hold. Undefined where /proc has no such process (not Linux, or gone).
 */
export function procPeakRssBytes(pid: number): number | undefined {
  try {
    const m = /^VmHWM:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) * 1024 : undefined;
  } catch {
    return undefined;
  }
}
