/**
 * A disruption notice: the platform announcing that this machine (or this pod) goes away at a
 * known time. Each source reports the whole set it holds now, every time it changes: a notice that
 * is no longer reported has been withdrawn (a maintenance cancelled, a taint removed). A source that
 * cannot read its endpoint reports nothing, so an outage never withdraws a notice.
 */

export const DISRUPTION_SOURCES = ['aws', 'gcp', 'azure', 'k8s'] as const;
export type DisruptionSourceName = (typeof DISRUPTION_SOURCES)[number];

export interface Notice {
  source: DisruptionSourceName;
  /** Stable while the platform announces the same thing: seen again, it is the same notice. */
  id: string;
  /** What was announced, for the drain reason and the logs ("spot instance-action terminate"). */
  what: string;
  /** When the machine goes (ms since the epoch): the drain hands off what still runs before it. */
  at: number;
}

export interface DisruptionSource {
  readonly name: DisruptionSourceName;
  /** Starts reading; `report` gets this source's whole current set on every change. */
  start(report: (notices: Notice[]) => void): void;
  close(): Promise<void>;
}

/** The earliest of several notices: the one the drain's deadline must meet. */
export function earliest(notices: Iterable<Notice>): Notice | undefined {
  let first: Notice | undefined;
  for (const n of notices) if (first === undefined || n.at < first.at) first = n;
  return first;
}

/** Notices compared by what a drain depends on (their ids and times). */
export function sameNotices(a: readonly Notice[], b: readonly Notice[]): boolean {
  const key = (ns: readonly Notice[]) => ns.map((n) => `${n.id}@${n.at}`).sort().join('\n');
  return key(a) === key(b);
}

/**
 * When each notice id was first seen: the time of a notice that says none (a started event, an
 * unreadable one) is when it appeared, not every poll's now. Forgets ids no longer reported.
 */
export class FirstSeen {
  private readonly seen = new Map<string, number>();
  private current = new Set<string>();

  /** Call once per read, before at(). */
  begin(): void {
    for (const id of this.seen.keys()) if (!this.current.has(id)) this.seen.delete(id);
    this.current = new Set();
  }

  at(id: string, now = Date.now()): number {
    this.current.add(id);
    let t = this.seen.get(id);
    if (t === undefined) this.seen.set(id, (t = now));
    return t;
  }
}
