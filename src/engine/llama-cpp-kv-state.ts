import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream, rmSync } from 'node:fs';
import { mkdtemp, readdir, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { Transform } from 'node:stream';
import type { Logger } from 'pino';
import type { LlamaContextSequence, Token } from 'node-llama-cpp';
import type { KvPayload, KvStateHandle } from './engine.js';
import { KvTransferStore, type KvTransfer } from './kv-transfers.js';

/**
 * Real KV movement for llama-cpp: a context sequence's state saved to a file (node-llama-cpp's
 * saveStateToFile), held as a KV transfer in the same ledger as the mocker's (pending until the
 * peer confirms, or its TTL), served to the peer that pulls it, and loaded there. llama.cpp only
 * checks that a state fits the context: a state from another model can crash the process, so the
 * receiver checks the model file's digest, the context and the bytes' hash before it loads one.
 */

export const KV_STATE_FORMAT = 'ebb-llama-kv/1';

/** What travels in the x-ebb-kv-state header ahead of the state's bytes. */
export interface KvStateHeader {
  format: string;
  /** sha256 of the GGUF file the state was computed with. */
  model_sha256: string;
  /** The source's context size: the state loads only into a context at least as large. */
  context_size: number;
  /** Tokens held in the state. */
  tokens: number;
  state_bytes: number;
  state_sha256: string;
}

/** This engine's side of the check: the model and the context a state must match. */
export interface KvIdentity {
  model_sha256: string;
  context_size: number;
}

/** A state this engine will not load: another model, a larger context, a size over the bound, bytes that do not hash. */
export class KvStateRefused extends Error {}

export interface KvStateOptions {
  /** Bytes of state files this worker holds at once (exports and imports together). */
  maxBytes: number;
  /** How long an exported state waits for its peer. */
  ttlMs: number;
}

export const KV_STATE_DEFAULTS: KvStateOptions = { maxBytes: 2 * 1024 ** 3, ttlMs: 30_000 };

const DIR_PREFIX = 'ebb-kv-';

/** sha256 of a file, streamed. */
export async function sha256File(path: string): Promise<string> {
  const hash = createHash('sha256');
  await pipeline(createReadStream(path), hash);
  return hash.digest('hex');
}

/** Removes the state folders of processes that no longer run (a worker killed before it could clean up). */
async function sweepDeparted(root: string, log: Logger): Promise<void> {
  const names = await readdir(root).catch(() => [] as string[]);
  for (const name of names) {
    const pid = Number(/^ebb-kv-(\d+)-/.exec(name)?.[1]);
    if (!Number.isInteger(pid) || pid === process.pid) continue;
    try {
      process.kill(pid, 0);
      continue; // still running: its own
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'EPERM') continue; // someone else's process
    }
    await rm(join(root, name), { recursive: true, force: true }).catch(() => undefined);
    log.info({ event: 'kv_state_swept', dir: name }, `removed KV state files left by process ${pid}`);
  }
}

/**
 * The state files of one worker, in a folder of its own (removed on close; a crashed worker's
 * folder is removed by the next worker that starts on the machine). Disk use is bounded by
 * `maxBytes` and counted in `bytes` (the ebb_kv_state_bytes metric).
 */
export class KvStateFiles {
  readonly transfers: KvTransferStore;
  private readonly exports = new Map<string, { path: string; header: string; bytes: number }>();
  private used = 0;
  private serial = 0;
  private closed = false;

  private constructor(
    private readonly dir: string,
    private readonly opts: KvStateOptions,
    private readonly identity: Promise<KvIdentity>,
    private readonly log: Logger,
  ) {
    this.transfers = new KvTransferStore(opts.ttlMs);
    // Confirmed or expired: the file goes with the ledger entry.
    const drop = (t: KvTransfer) => this.dropExport(t.transfer_id);
    this.transfers.on('completed', drop);
    this.transfers.on('expired', drop);
  }

  static async open(opts: KvStateOptions, identity: Promise<KvIdentity>, log: Logger): Promise<KvStateFiles> {
    const root = tmpdir();
    await sweepDeparted(root, log);
    const dir = await mkdtemp(join(root, `${DIR_PREFIX}${process.pid}-`));
    identity.catch(() => undefined); // asked for when a state moves; a failure surfaces there
    return new KvStateFiles(dir, opts, identity, log);
  }

  /** Bytes of state files on disk now. */
  get bytes(): number {
    return this.used;
  }

  get maxBytes(): number {
    return this.opts.maxBytes;
  }

  private nextPath(kind: string): string {
    return join(this.dir, `${kind}-${++this.serial}.state`);
  }

  /**
   * Saves the sequence's state and holds it as a pending transfer. Throws when the disk bound
   * would be passed (the caller then goes on without: a re-prefill on the peer).
   */
  async export(sequence: LlamaContextSequence, promptTokens: number): Promise<KvTransfer> {
    if (this.closed) throw new Error('the engine is closed');
    if (this.used >= this.opts.maxBytes) throw new KvStateRefused(`KV state files already use ${this.used} of ${this.opts.maxBytes} bytes`);
    const identity = await this.identity;
    const path = this.nextPath('out');
    const tokens = sequence.contextTokens.length;
    let counted = 0;
    let header: KvStateHeader;
    let bytes: number;
    try {
      await sequence.saveStateToFile(path);
      bytes = (await stat(path)).size;
      this.used += bytes;
      counted = bytes;
      if (this.used > this.opts.maxBytes) throw new KvStateRefused(`a ${bytes}-byte KV state would pass the bound of ${this.opts.maxBytes} bytes`);
      header = { format: KV_STATE_FORMAT, ...identity, tokens, state_bytes: bytes, state_sha256: await sha256File(path) };
    } catch (err) {
      // A partial file (a full disk) or one past the bound: gone, and its bytes no longer counted.
      this.remove(path, counted);
      throw err;
    }
    const transfer = this.transfers.create(promptTokens, bytes);
    this.exports.set(transfer.transfer_id, { path, header: JSON.stringify(header), bytes });
    return transfer;
  }

  payload(transferId: string): KvPayload | undefined {
    if (this.transfers.get(transferId) === undefined) return undefined;
    return this.exports.get(transferId);
  }

  /** Checks a peer's header, then receives exactly the bytes it announced, hashing them on the way. */
  async import(headerText: string, declared: number, body: AsyncIterable<Uint8Array>, signal: AbortSignal): Promise<KvStateHandle> {
    if (this.closed) throw new Error('the engine is closed');
    const header = parseHeader(headerText);
    const own = await this.identity;
    if (header.model_sha256 !== own.model_sha256) throw new KvStateRefused('the state was computed with another model file (sha256 differs)');
    if (header.context_size > own.context_size || header.tokens > own.context_size)
      throw new KvStateRefused(`the state's context (${header.context_size} tokens) is larger than this engine's (${own.context_size})`);
    if (declared !== header.state_bytes) throw new KvStateRefused(`the body is ${declared} bytes; the state header says ${header.state_bytes}`);
    if (this.used + declared > this.opts.maxBytes) throw new KvStateRefused(`a ${declared}-byte state would pass the bound of ${this.opts.maxBytes} bytes (${this.used} in use)`);
    const path = this.nextPath('in');
    this.used += declared;
    let received = 0;
    const hash = createHash('sha256');
    const count = new Transform({
      transform(chunk: Buffer, _enc, done) {
        received += chunk.length;
        if (received > declared) return done(new KvStateRefused(`the peer sent more than the ${declared} bytes it announced`));
        hash.update(chunk);
        done(null, chunk);
      },
    });
    try {
      await pipeline(body, count, createWriteStream(path), { signal });
      if (received !== declared) throw new KvStateRefused(`truncated: ${received} of ${declared} bytes`);
      if (hash.digest('hex') !== header.state_sha256) throw new KvStateRefused('the bytes do not match the state hash (corrupt)');
    } catch (err) {
      this.remove(path, declared);
      throw err;
    }
    let disposed = false;
    return {
      path,
      tokens: header.tokens,
      dispose: async () => {
        if (disposed) return;
        disposed = true;
        this.remove(path, declared);
      },
    };
  }

  /**
   * Loads `handle` into `sequence` and keeps the longest prefix of `input` it holds, leaving at
   * least one token for the caller to evaluate (the next token's logits are not part of a state).
   * Returns the tokens kept, or undefined when the state did not load (the caller takes a fresh
   * sequence and evaluates everything: a re-prefill).
   */
  async load(sequence: LlamaContextSequence, handle: KvStateHandle, input: readonly Token[]): Promise<number | undefined> {
    try {
      await sequence.loadStateFromFile(handle.path, { acceptRisk: true });
      const held = sequence.contextTokens;
      let keep = 0;
      while (keep < held.length && keep < input.length - 1 && held[keep] === input[keep]) keep++;
      if (keep < held.length) await sequence.eraseContextTokenRanges([{ start: keep, end: held.length }]);
      return keep;
    } catch (err) {
      this.log.warn({ event: 'kv_state_load_failed', err: (err as Error).message }, `a pulled KV state did not load (${(err as Error).message}); evaluating the prompt here`);
      return undefined;
    } finally {
      await handle.dispose();
    }
  }

  private dropExport(id: string): void {
    const entry = this.exports.get(id);
    if (!entry) return;
    this.exports.delete(id);
    this.remove(entry.path, entry.bytes);
  }

  /** Synchronous: the file is gone when the ledger says so (an unlink is far cheaper than what a state costs). */
  private remove(path: string, bytes: number): void {
    this.used -= bytes;
    rmSync(path, { force: true });
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.transfers.close();
    this.exports.clear();
    this.used = 0;
    await rm(this.dir, { recursive: true, force: true });
  }
}

function parseHeader(text: string): KvStateHeader {
  let h: Partial<KvStateHeader>;
  try {
    h = JSON.parse(text) as Partial<KvStateHeader>;
  } catch {
    throw new KvStateRefused('the state header is not JSON');
  }
  if (h.format !== KV_STATE_FORMAT) throw new KvStateRefused(`unknown state format ${JSON.stringify(h.format)} (expected ${KV_STATE_FORMAT})`);
  const ints = [h.context_size, h.tokens, h.state_bytes];
  if (typeof h.model_sha256 !== 'string' || typeof h.state_sha256 !== 'string' || !ints.every((n) => Number.isSafeInteger(n) && (n as number) >= 0))
    throw new KvStateRefused('the state header lacks a field');
  return h as KvStateHeader;
}
