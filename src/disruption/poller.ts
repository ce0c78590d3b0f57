import type { Logger } from 'pino';
import { pause } from '../common/backoff.js';
import { sameNotices, type DisruptionSource, type DisruptionSourceName, type Notice } from './notice.js';

/**
 * A source whose platform has no push: its endpoint read every `everyMs` (what AWS and Azure
 * document for their notices). A read that fails reports nothing: the last set stands until a read
 * succeeds, so an endpoint outage neither invents nor withdraws a notice. One warning per outage.
 */
export class NoticePoller implements DisruptionSource {
  private readonly stop = new AbortController();
  private running: Promise<void> | undefined;

  constructor(
    readonly name: DisruptionSourceName,
    private readonly read: (signal: AbortSignal) => Promise<Notice[]>,
    private readonly everyMs: number,
    private readonly log: Logger,
  ) {}

  start(report: (notices: Notice[]) => void): void {
    this.running ??= this.loop(report);
  }

  async close(): Promise<void> {
    this.stop.abort();
    await this.running;
  }

  private async loop(report: (notices: Notice[]) => void): Promise<void> {
    let last: Notice[] | undefined;
    let failing = false;
    const signal = this.stop.signal;
    while (!signal.aborted) {
      try {
        const notices = await this.read(signal);
        if (failing) this.log.info({ event: 'disruption_source_recovered', source: this.name }, `${this.name} disruption notices readable again`);
        failing = false;
        if (last === undefined || !sameNotices(last, notices)) report(notices);
        last = notices;
      } catch (err) {
        if (signal.aborted) return;
        if (!failing) this.log.warn({ event: 'disruption_source_failed', source: this.name, err: (err as Error).message }, `${this.name} disruption notices unreadable (the last ones read stand): ${(err as Error).message}`);
        failing = true;
      }
      if (!(await pause(this.everyMs, signal))) return;
    }
  }
}
