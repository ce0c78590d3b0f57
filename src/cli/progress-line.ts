import { printable } from '../common/terminal-text.js';
import { formatDuration } from '../common/format-duration.js';
import type { WorkerStatus } from '../common/worker-admin.js';

/** How waiting commands show progress on stderr. */

export { formatDuration };

/**
 * A progress line on stderr: rewritten in place (\r) on a terminal; elsewhere (CI logs, pipes) one
 * line each time what it says changes, ignoring the elapsed time so a log is not one line per poll.
 */
export class ProgressLine {
  private last = '';
  private readonly tty: boolean;
  private drawn = false;

  constructor(private readonly out: NodeJS.WriteStream = process.stderr) {
    this.tty = out.isTTY === true;
  }

  /** `volatile` (an ETA) is shown but, like the elapsed time, does not make a new line off a terminal. */
  update(raw: string, elapsedMs: number, rawVolatile = ''): void {
    // It quotes what a worker reports: shown escaped, so it stays this one line.
    const text = printable(raw);
    const volatile = printable(rawVolatile);
    if (this.tty) {
      this.out.write(`\r${text}${volatile}  ${formatDuration(elapsedMs)}\x1b[K`);
      this.drawn = true;
    } else if (text !== this.last) this.out.write(`${text}${volatile}  (${formatDuration(elapsedMs)})\n`);
    this.last = text;
  }

  /** Ends the line on a terminal so the next output starts clean. */
  done(): void {
    if (this.tty && this.drawn) this.out.write('\n');
    this.drawn = false;
  }
}

/** The drain's ETA as the worker estimates it: "eta 4.2s", "eta unknown" while it cannot tell; empty when not waiting. */
export function describeEta(s: WorkerStatus): string {
  if (s.state !== 'draining' && s.state !== 'stopping') return '';
  return s.eta_ms === undefined || s.eta_ms === null ? ', eta unknown' : `, eta ${formatDuration(s.eta_ms)}`;
}

export function describeWaiting(s: WorkerStatus, withEta = true): string {
  const waits = s.waiting_for.length > 0 ? `, waiting for: ${s.waiting_for.join('; ')}` : '';
  return `${s.state}, in-flight ${s.inflight_requests}${withEta ? describeEta(s) : ''}${waits}`;
}
