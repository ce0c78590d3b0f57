/** A kept stream's release of held bytes: those up to this mark may go out ('drop': they never go out). */
export type Release = number | 'drop';

/**
 * Bytes that wait for a kept stream's copy (see StreamTap): each with the mark it is released at, in
 * the order they were written. The client's connection and a kept stream's followers each hold theirs.
 */
export class HeldBytes {
  private bufs: Buffer[] = [];
  private marks: number[] = [];

  get size(): number {
    return this.bufs.length;
  }

  hold(buf: Buffer, mark: number): void {
    this.bufs.push(buf);
    this.marks.push(mark);
  }

  /** Those a release lets go, taken out in order (none for 'drop': every one held is discarded). */
  take(upTo: Release): Buffer[] {
    if (upTo === 'drop') {
      this.bufs = [];
      this.marks = [];
      return [];
    }
    let k = 0;
    while (k < this.bufs.length && this.marks[k]! <= upTo) k++;
    if (k === 0) return [];
    this.marks.splice(0, k);
    return this.bufs.splice(0, k);
  }
}
