/**
 * ebb's one bounded reader of a peer's bytes (a worker's answers and streams, an engine's pages, a
 * prefill worker's KV): a peer that sends without end must cost this process a bounded amount of
 * memory, and chunks are kept as they come and joined once, never copied again on every read (a
 * line without a newline re-copied per chunk took a frontend's event loop for seconds).
 */

export class AnswerTooLarge extends Error {
  constructor(
    readonly maxBytes: number,
    what = 'answer',
  ) {
    super(`${what} over ${maxBytes} bytes`);
    this.name = 'AnswerTooLarge';
  }
}

/** Chunks held up to `maxBytes`, joined once. */
export class BoundedBytes {
  private chunks: Uint8Array[] = [];
  /** Bytes held. */
  size = 0;

  constructor(readonly maxBytes: number) {}

  /**
   * Holds `chunk`; false when it would take the total past the bound. With `cut`, what fits is
   * still held (a message is read up to the bound); without, nothing of the chunk is.
   */
  push(chunk: Uint8Array, cut = false): boolean {
    const room = this.maxBytes - this.size;
    if (chunk.byteLength <= room) {
      this.chunks.push(chunk);
      this.size += chunk.byteLength;
      return true;
    }
    if (cut && room > 0) {
      this.chunks.push(chunk.subarray(0, room));
      this.size += room;
    }
    return false;
  }

  /** Everything held, as one buffer; the holder is empty again. */
  take(): Buffer {
    const all = this.chunks.length === 1 ? Buffer.from(this.chunks[0]!.buffer, this.chunks[0]!.byteOffset, this.chunks[0]!.byteLength) : Buffer.concat(this.chunks, this.size);
    this.chunks = [];
    this.size = 0;
    return all;
  }
}

export interface ReadBoundedOptions {
  /** Past the bound, return what fit (an error message's start) instead of failing. */
  cut?: boolean;
  /** Named in the AnswerTooLarge message. */
  what?: string;
}

/**
 * A body's bytes, up to `maxBytes`: past it the body is destroyed (the connection dropped, nothing
 * more is read) and the read fails with AnswerTooLarge, or, with `cut`, returns what fit.
 */
export async function readBoundedBytes(body: AsyncIterable<Uint8Array> & { destroy?: () => unknown }, maxBytes: number, opts: ReadBoundedOptions = {}): Promise<Buffer> {
  const held = new BoundedBytes(maxBytes);
  for await (const chunk of body) {
    if (held.push(chunk, opts.cut)) continue;
    body.destroy?.();
    if (opts.cut) break;
    throw new AnswerTooLarge(maxBytes, opts.what);
  }
  return held.take();
}

/** readBoundedBytes as UTF-8 text. */
export async function readBounded(body: AsyncIterable<Uint8Array> & { destroy?: () => unknown }, maxBytes: number, opts: ReadBoundedOptions = {}): Promise<string> {
  return (await readBoundedBytes(body, maxBytes, opts)).toString('utf8');
}

/**
 * Counts a body's bytes without keeping them, failing past `maxBytes` (a KV payload larger than the
 * source said it would send).
 */
export async function countBounded(body: AsyncIterable<Uint8Array> & { destroy?: () => unknown }, maxBytes: number, what?: string): Promise<number> {
  let size = 0;
  for await (const chunk of body) {
    size += chunk.byteLength;
    if (size > maxBytes) {
      body.destroy?.();
      throw new AnswerTooLarge(maxBytes, what);
    }
  }
  return size;
}
