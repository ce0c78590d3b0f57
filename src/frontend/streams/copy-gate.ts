import type { Release } from '../relay/held-bytes.js';

/**
 * What a shared stream's clients may be sent: only bytes the fleet's copy holds. A frontend killed
 * at any instant then leaves no client ahead of the copy another frontend continues from: the
 * continuation is numbered and generated from exactly where every client stands, whatever the
 * engine's sampling or the order its choices' tokens came in.
 *
 * Marks count the bytes appended since the gate was made. A release tells each listener the mark
 * now copied: `Infinity` when everything goes (the stream ended, or the copy can no longer be
 * relied on and availability comes first), 'drop' when what is held must never go out (another
 * frontend continues from the copy).
 * - gating: appended bytes wait for the batch that copies them;
 * - open: bytes go out as they come (the store failed a batch: until the copy is rewritten whole);
 * - done: for good (ended, handed on, overflowed, or dropped).
 */
export type GateState = 'gating' | 'open' | 'done';


export class CopyGate {
  private state: GateState = 'gating';
  private appended = 0;
  private readonly listeners: Array<(upTo: Release) => void> = [];

  /** Bytes just appended: the mark a listener releases them at, or undefined when they go out now. */
  mark(bytes: number): number | undefined {
    this.appended += bytes;
    return this.state === 'gating' ? this.appended : undefined;
  }

  /** Everything appended so far: what a batch sent now covers. */
  get at(): number {
    return this.appended;
  }

  get current(): GateState {
    return this.state;
  }

  onRelease(fn: (upTo: Release) => void): void {
    this.listeners.push(fn);
  }

  /** The copy holds everything up to `upTo`. */
  copied(upTo: number): void {
    if (this.state === 'gating') this.tell(upTo);
  }

  /** The copy is behind and cannot be waited for now: everything held goes; later bytes too, until gate() again. */
  open(): void {
    if (this.state !== 'gating') return;
    this.state = 'open';
    this.tell(Infinity);
  }

  /** The copy holds everything again (rewritten whole): later bytes wait for it again. */
  gate(): void {
    if (this.state === 'open') this.state = 'gating';
  }

  /** For good: what is held goes (`drop`: never goes out). */
  close(how: 'release' | 'drop'): void {
    if (this.state === 'done') return;
    const was = this.state;
    this.state = 'done';
    if (was === 'gating' || how === 'drop') this.tell(how === 'drop' ? 'drop' : Infinity);
  }

  private tell(upTo: Release): void {
    for (const fn of this.listeners) fn(upTo);
  }
}
