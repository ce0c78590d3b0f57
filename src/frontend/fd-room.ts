import { readFileSync } from 'node:fs';

/**
 * The open-file limits this process runs under (Linux /proc). Node raises the soft limit to the
 * hard one itself at start (node.cc, PlatformInit), so there is nothing left for the frontend to
 * raise: what it can do is say how much room that leaves, and what bounds it.
 */
export function fdLimits(): { soft: number; hard: number | 'unlimited' } | undefined {
  try {
    const line = readFileSync('/proc/self/limits', 'utf8')
      .split('\n')
      .find((l) => l.startsWith('Max open files'));
    const [, soft, hard] = line?.split(/\s{2,}/) ?? [];
    const s = Number(soft);
    if (!Number.isFinite(s) || s <= 0) return undefined;
    return { soft: s, hard: hard === 'unlimited' ? 'unlimited' : Number(hard) };
  } catch {
    return undefined;
  }
}

/** Every stream through the frontend holds two descriptors: its client connection and its worker socket. */
export const FDS_PER_STREAM = 2;

/** Concurrent single-sequence streams an fd budget leaves room for. */
export const streamsRoom = (fdBudget: number): number => Math.floor(fdBudget / FDS_PER_STREAM);
