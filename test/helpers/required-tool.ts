const warned = new Set<string>();

/**
 * For `{ skip: skipWithout(available, reason) }` on suites that drive a real tool (etcd, chromium,
 * promtool): undefined when it is installed. Missing, it prints a banner once and returns the skip
 * reason, except under CI=true, where a silently skipped suite would hide a broken environment,
 * so it throws instead.
 */
export function skipWithout(available: boolean, reason: string): string | undefined {
  if (available) return undefined;
  if (process.env.CI === 'true') throw new Error(`${reason} -- refusing to skip under CI=true`);
  if (!warned.has(reason)) {
    warned.add(reason);
    const bar = '!'.repeat(reason.length + 8);
    console.error(`\n${bar}\n!!! ${reason} !!!\n${bar}\n`);
  }
  return reason;
}
