import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';

/** The unit of /proc's CPU times (USER_HZ): 100 where getconf cannot say. */
export const CLOCK_TICKS = ((): number => {
  try {
    return Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
  } catch {
    return 100;
  }
})();

/** User + system CPU time of a process (all its threads), in ms; undefined where /proc has no such process (not Linux, or gone). */
export function procCpuMs(pid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // Fields after "(comm)": state is index 0, so utime (field 14) is index 11 and stime index 12.
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / CLOCK_TICKS;
  } catch {
    return undefined;
  }
}
