/** How far back a worker remembers its in-flight count (the dashboard's chart window). */
export const INFLIGHT_HISTORY_MS = 60_000;
/** One kept point per slot: in-flight changes come by the hundred a second under load. */
export const INFLIGHT_SLOT_MS = 250;

/**
 * The worker's in-flight count over the last minute, as change points, so a dashboard opened now
 * draws the minute before it opened. At most one point per slot (the slot's last value), so the
 * memory is bounded by window / slot whatever the load.
 */
export class InflightHistory {
  /** [ms since epoch, in-flight], oldest first. */
  private readonly points: Array<[number, number]> = [];

  constructor(initial = 0, now = Date.now()) {
    this.points.push([now, initial]);
  }

  record(value: number, now = Date.now()): void {
    const last = this.points[this.points.length - 1] as [number, number];
    // Within a slot the slot's last value stands; the first point stays: it opens the window.
    if (this.points.length > 1 && now - last[0] < INFLIGHT_SLOT_MS) last[1] = value;
    else if (last[1] !== value) this.points.push([now, value]);
    this.prune(now);
  }

  /** [age in ms, in-flight] oldest first: ages, not times, so a clock elsewhere need not agree with ours. */
  list(now = Date.now()): Array<[number, number]> {
    this.prune(now);
    return this.points.map(([t, v]) => [Math.max(0, now - t), v]);
  }

  private prune(now: number): void {
    // Keep the last point older than the window: it says what the count was when the window opened.
    while (this.points.length > 1 && (this.points[1] as [number, number])[0] <= now - INFLIGHT_HISTORY_MS) this.points.shift();
  }
}
