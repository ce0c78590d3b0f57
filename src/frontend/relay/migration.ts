import type { ContinuationBody, GenerateBody, Usage } from '../../protocol/request-plane.js';
import { copyBytes } from '../wire/token-splice.js';

/** Why a stream moved to another worker: the label of ebb_frontend_migrations_total (`preempted`: continued after a pause for a priority request). */
export type MigrationReason = 'worker_failed' | 'worker_unresponsive' | 'handoff' | 'preempted';

/**
 * What one request has delivered so far, across every worker that served part of it. A stream
 * that breaks is continued from exactly this on another worker, so the client sees one answer:
 * no token twice, none missing, one usage for the whole completion.
 */
export class Delivered {
  /** The text as UTF-8 (the relay's plain tokens arrive as bytes and are copied, never decoded). */
  private bytes = Buffer.allocUnsafe(256);
  private length = 0;
  tokens = 0;
  /** Token ids, as long as every piece carried them (an engine without ids makes this text-only). */
  private ids: number[] | undefined = [];
  /** Tokens generated before the worker now serving: added to its usage at the end. */
  private before = 0;
  migrations = 0;

  get text(): string {
    return this.bytes.toString('utf8', 0, this.length);
  }

  /** The text's length in UTF-8 bytes: a mark a kept stream records with the events it copied (see StreamTap.progress). */
  get byteLength(): number {
    return this.length;
  }

  /** The text between two marks (byte offsets at token boundaries). */
  textBetween(from: number, to: number): string {
    return this.bytes.toString('utf8', from, to);
  }

  /** One token without ids whose text is the UTF-8 of buf[start, end). */
  addBytes(buf: Buffer, start: number, end: number): void {
    this.room(end - start);
    this.length = copyBytes(buf, start, end, this.bytes, this.length);
    this.tokens++;
    this.ids = undefined;
  }

  /** What another frontend delivered before it went away (a takeover): text, counted tokens, no ids. */
  restore(text: string, tokens: number): void {
    this.add(text, undefined);
    this.tokens = tokens;
    this.ids = undefined;
  }

  add(text: string, tokenIds: number[] | undefined): void {
    const size = Buffer.byteLength(text);
    this.room(size);
    this.length += this.bytes.write(text, this.length, size, 'utf8');
    if (tokenIds === undefined) {
      this.tokens++;
      this.ids = undefined;
    } else {
      this.tokens += tokenIds.length;
      this.ids?.push(...tokenIds);
    }
  }

  private room(size: number): void {
    if (this.length + size <= this.bytes.length) return;
    const grown = Buffer.allocUnsafe(Math.max(this.bytes.length * 2, this.length + size));
    this.bytes.copy(grown, 0, 0, this.length);
    this.bytes = grown;
  }

  /**
   * The request to send the next worker: the original, what it already has, and what is left of its
   * budget. The kv router hashes its prompt and this text (routing/prompt-blocks.ts), so the stream
   * moves to the worker that holds most of both.
   */
  continuation(original: GenerateBody, migration = true): GenerateBody {
    this.before = this.tokens;
    // A preempted stream's continuation is not a migration: --migration-limit bounds failures, --preemption-limit pauses.
    if (migration) this.migrations++;
    const continuation: ContinuationBody = { text: this.text, completion_tokens: this.tokens };
    if (this.ids !== undefined && this.ids.length === this.tokens) continuation.token_ids = this.ids;
    const body: GenerateBody = { ...original, continuation };
    if (original.max_tokens !== undefined) body.max_tokens = Math.max(0, original.max_tokens - this.tokens);
    return body;
  }

  /** The final worker counted only its own tokens; the client is told about the whole completion. */
  usage(last: Usage): Usage {
    const completion = last.completion_tokens + this.before;
    const usage: Usage = { prompt_tokens: last.prompt_tokens, completion_tokens: completion, total_tokens: last.prompt_tokens + completion };
    // What the worker that finished found cached (after a migration: the new worker's), checked as it comes off the wire.
    const cached = last.prompt_tokens_details?.cached_tokens;
    if (Number.isSafeInteger(cached) && (cached as number) >= 0) usage.prompt_tokens_details = { cached_tokens: Math.min(cached as number, last.prompt_tokens) };
    return usage;
  }
}
