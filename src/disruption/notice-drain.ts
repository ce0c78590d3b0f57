import type { Logger } from 'pino';
import type { Lifecycle } from '../lifecycle/lifecycle.js';
import { earliest, type DisruptionSourceName, type Notice } from './notice.js';

export interface NoticeDrainOptions {
  /** The drain hands off what still runs this long before the notice's time (--disruption-margin-ms). */
  marginMs: number;
  /** A notice further ahead than margin + this starts its drain only then (--disruption-lead-ms). */
  leadMs: number;
}

/**
 * What the notices have done to the worker: nothing (`quiet`); a drain due later (`armed`: the
 * notice is further ahead than the lead); a drain this controller started (`draining`, at the
 * generation the drain answered with: only that drain is undone when the notice is withdrawn); or
 * a drain that was not its own (`deferred`: the worker was drained already, or is going down; the
 * notice's deadline still applies to it, and a withdrawal leaves it as it is).
 */
type State =
  | { readonly name: 'quiet' }
  | { readonly name: 'armed'; readonly notice: Notice; readonly timer: NodeJS.Timeout }
  | { readonly name: 'draining'; readonly notice: Notice; readonly generation: number }
  | { readonly name: 'deferred'; readonly notice: Notice };

const sameNotice = (a: Notice, b: Notice): boolean => a.source === b.source && a.id === b.id && a.at === b.at;

/**
 * Turns the sources' notices into the worker's drain: the earliest notice starts a drain whose
 * deadline is its time less the margin (streams still running then are handed off, with their KV
 * where the engine can), named for its source; an earlier notice moves the deadline closer; once
 * every notice is withdrawn, the drain the notices started is resumed. Its state has one owner
 * (this class) and one setter; reports are applied one at a time, in order.
 */
export class NoticeDrain {
  private state: State = { name: 'quiet' };
  private readonly bySource = new Map<DisruptionSourceName, Notice[]>();
  private chain: Promise<void> = Promise.resolve();
  private closed = false;

  constructor(
    private readonly lifecycle: Lifecycle,
    private readonly opts: NoticeDrainOptions,
    private readonly log: Logger,
  ) {}

  /** A source's whole current set. */
  report(source: DisruptionSourceName, notices: Notice[]): void {
    this.bySource.set(source, notices);
    this.enqueue();
  }

  close(): void {
    this.closed = true;
    const s = this.state;
    if (s.name === 'armed') clearTimeout(s.timer);
    this.set({ name: 'quiet' });
  }

  private enqueue(): void {
    this.chain = this.chain.then(
      () => this.apply(),
      () => this.apply(),
    );
  }

  private set(next: State): void {
    this.state = next;
  }

  private async apply(): Promise<void> {
    if (this.closed) return;
    const next = earliest([...this.bySource.values()].flat());
    const s = this.state;
    if (next === undefined) return this.withdrawn(s);
    if (s.name !== 'quiet' && sameNotice(s.notice, next)) return; // nothing new
    if (s.name === 'armed') clearTimeout(s.timer);
    const now = Date.now();
    const startAt = next.at - this.opts.marginMs - this.opts.leadMs;
    if (startAt > now) {
      // A timer is right here: the notice's time is a point the platform chose.
      const timer = setTimeout(() => this.armedFired(timer), startAt - now);
      this.log.info({ event: 'disruption_notice', source: next.source, notice: next.what, at: iso(next.at), drain_at: iso(startAt) }, `${next.source} notice: ${next.what} at ${iso(next.at)}; the drain starts at ${iso(startAt)}`);
      return this.set({ name: 'armed', notice: next, timer });
    }
    await this.drainFor(next, s);
  }

  private armedFired(timer: NodeJS.Timeout): void {
    const s = this.state;
    if (s.name !== 'armed' || s.timer !== timer) return;
    this.set({ name: 'quiet' }); // the next apply drains for it
    this.enqueue();
  }

  private async drainFor(n: Notice, before: State): Promise<void> {
    const deadlineMs = Math.max(0, Math.round(n.at - this.opts.marginMs - Date.now()));
    const reason = `${n.source} disruption notice: ${n.what}, at ${iso(n.at)}`;
    this.log.info({ event: 'disruption_notice', source: n.source, notice: n.what, at: iso(n.at), deadline_ms: deadlineMs }, `${n.source} notice: ${n.what} at ${iso(n.at)}; draining, hand-off in ${deadlineMs} ms`);
    try {
      const status = await this.lifecycle.drain(reason, { deadlineMs, actor: `disruption source ${n.source}`, persist: false });
      // Ours: the drain this call started, or the one an earlier notice of ours started and this one moved closer.
      const ours = status.drain_reason === reason || (before.name === 'draining' && status.generation === before.generation);
      if (this.closed) return;
      this.set(ours ? { name: 'draining', notice: n, generation: status.generation } : { name: 'deferred', notice: n });
    } catch (err) {
      // Refused (the worker is shutting down, or not started): nothing of ours to undo later.
      this.log.warn({ event: 'disruption_drain_refused', source: n.source, err: (err as Error).message }, `drain for the ${n.source} notice refused: ${(err as Error).message}`);
      if (!this.closed) this.set({ name: 'deferred', notice: n });
    }
  }

  private async withdrawn(s: State): Promise<void> {
    if (s.name === 'quiet') return;
    if (s.name === 'armed') clearTimeout(s.timer);
    this.set({ name: 'quiet' });
    this.log.info({ event: 'disruption_withdrawn', source: s.notice.source, notice: s.notice.what, resumes: s.name === 'draining' }, `${s.notice.source} notice withdrawn: ${s.notice.what}${s.name === 'draining' ? '; resuming' : ''}`);
    if (s.name !== 'draining') return;
    try {
      await this.lifecycle.resume({ actor: `disruption source ${s.notice.source} (notice withdrawn)`, onlyGeneration: s.generation });
    } catch (err) {
      this.log.warn({ event: 'disruption_resume_skipped', source: s.notice.source, err: (err as Error).message }, `not resumed after the withdrawn notice: ${(err as Error).message}`);
    }
  }
}

const iso = (ms: number): string => new Date(ms).toISOString();
